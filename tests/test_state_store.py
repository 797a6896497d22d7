"""The durable state store (agentrt/state/sql.py), SQLite and PostgreSQL, through one interface.

The PostgreSQL runs are against a real server the test session starts (conftest.postgres_url:
Debian's postgresql, installed by .ci/ensure_postgres); without one they are skipped, with why.
"""

from __future__ import annotations

import time

import pytest

from agentrt.errors import StateStoreError
from agentrt.state import KVRow, SessionRow, StoredResponse, open_store
from agentrt.state.records import forget_session


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = open_store(tmp_path)
    else:
        from tests.conftest import fresh_postgres_db

        s = open_store(state_url=fresh_postgres_db(request.getfixturevalue("postgres_url")))
    yield s
    s.close()


def _resp(rid: str, tenant: str = "t1", key: str | None = "k", ttl: float = 60.0) -> StoredResponse:
    return StoredResponse(rid, tenant, {"id": rid, "output": [{"text": "é ✓"}]}, [{"role": "user", "content": rid}],
                          key, time.time() + ttl)


def test_responses_are_per_tenant_bounded_and_expire(store):
    store.put_response(_resp("r1"), max_count=3)
    got = store.get_response("t1", "r1")
    assert got.body["output"][0]["text"] == "é ✓" and got.chain == [{"role": "user", "content": "r1"}]
    assert got.session_key == "k"
    assert store.get_response("t2", "r1") is None  # another tenant's id reads as unknown
    store.put_response(_resp("old", ttl=-1.0), max_count=3)
    assert store.get_response("t1", "old") is None  # expired
    for i in range(5):
        store.put_response(_resp(f"n{i}"), max_count=3)
    assert store.count_responses() == 3 and store.get_response("t1", "n4") is not None
    assert store.get_response("t1", "r1") is None  # the oldest went first
    assert not store.delete_response("t2", "n4") and store.delete_response("t1", "n4")
    assert store.get_response("t1", "n4") is None


def test_sessions_registry_and_forgetting_only_what_one_session_used(store, tmp_path):
    now = time.time()
    for rid in ("shared", "mine", "theirs"):
        (tmp_path / "kv" / rid[:2]).mkdir(parents=True, exist_ok=True)
        (tmp_path / "kv" / rid[:2] / f"{rid}.kv").write_bytes(b"x")
        assert store.kv_put(KVRow(rid, "p", 0, 4, b"\0" * 16, 1, None, now))
    store.put_session(SessionRow("a", "salt", "m", None, "h1", 8, ("shared", "mine"), now))
    store.put_session(SessionRow("b", "salt", "m", "ad", "h2", 8, ("shared", "theirs"), now))
    assert store.get_session("a").records == ("shared", "mine") and store.get_session("b").adapter == "ad"
    assert forget_session(store, tmp_path, "a") == 1
    assert store.get_session("a") is None
    assert sorted(r.id for r in store.kv_all()) == ["shared", "theirs"]
    assert not (tmp_path / "kv" / "mi" / "mine.kv").exists() and (tmp_path / "kv" / "sh" / "shared.kv").exists()


def test_kv_index_rows(store):
    row = KVRow("r1", "root", 0, 3, bytes(range(12)), 100, "agent", 1.0)
    assert store.kv_put(row) and not store.kv_put(row)  # (content-addressed: a second write is a no-op)
    assert store.kv_children("root") == [row] and store.kv_children("other") == []
    store.kv_put(KVRow("r2", "r1-key", 3, 2, b"\1" * 8, 50, None, 2.0))
    assert store.kv_bytes() == 150 and {r.id for r in store.kv_get(["r1", "r2", "nope"])} == {"r1", "r2"}
    store.kv_touch(["r1"])
    assert store.kv_children("root")[0].last_use > 1.0
    store.kv_delete(["r1"])
    assert store.kv_bytes() == 50 and store.kv_children("root") == []


def test_conversations(store):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi", "extra": [1, None]}]
    store.put_conversation("agent/a", msgs)
    assert store.get_conversation("agent/a") == msgs and store.get_conversation("agent/b") is None
    store.delete_conversation("agent/a")
    assert store.get_conversation("agent/a") is None


def test_bad_settings_are_typed_errors(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StateStoreError, match="state_dir"):
        open_store(tmp_path / "file" / "sub")
    with pytest.raises(StateStoreError, match="postgresql://"):
        open_store(state_url="mysql://x")
    with pytest.raises(StateStoreError, match="cannot connect") as e:
        open_store(state_url="postgresql://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(e.value)  # (the password never reaches a message)
    s = open_store(tmp_path)
    s.close()
    with pytest.raises(StateStoreError, match="closed"):
        s.get_response("t", "r")
