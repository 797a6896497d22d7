"""The server over a durable state store (issue 59), with the official `openai` client: a restarted
server continues a `previous_response_id` chain with the chain's KV from disk; DELETE forgets a
chain's KV once no stored response continues it; two servers sharing one PostgreSQL store (and
state dir) resolve a chain that alternates between them."""

from __future__ import annotations

import openai
import pytest

from agentrt import EngineConfig
from agentrt.server import ServerConfig, ServerThread
from agentrt.state import open_store

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

QUESTIONS = ["Hi! What is the capital of France?", "And of Italy?", "And of Spain?", "What about Germany?"]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="none-0000", max_retries=0)


def _ask(c: openai.OpenAI, q: str, prev: str | None):
    return c.responses.create(model="tiny", input=q, previous_response_id=prev, max_output_tokens=16, temperature=0)


def _computed(r) -> int:
    return r.usage.model_extra["agentrt"]["computed_input_tokens"]


def test_a_restarted_server_continues_a_chain_with_its_kv(embedded_native, tmp_path):
    lm, sc = embedded_native, ServerConfig(port=0, model_name="tiny")
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), response_cache_size=0)
    with ServerThread(lm, sc, cfg) as s:
        c, prev = _client(s), None
        for q in QUESTIONS[:3]:
            prev = _ask(c, q, prev).id
    with ServerThread(lm, sc, cfg) as s:  # a new process over the same state dir
        r = _ask(_client(s), QUESTIONS[3], prev)
    with ServerThread(lm, sc, EngineConfig(kv_cache_tokens=8192, response_cache_size=0)) as s:  # never restarted
        c, p = _client(s), None
        for q in QUESTIONS:
            unbroken = _ask(c, q, p)
            p = unbroken.id
    assert r.output_text == unbroken.output_text and r.usage.input_tokens == unbroken.usage.input_tokens
    assert _computed(r) <= _computed(unbroken) + 16  # (the history came back from disk, within a page)


def test_delete_forgets_the_chain_and_only_its_kv(embedded_native, tmp_path):
    lm, sc = embedded_native, ServerConfig(port=0, model_name="tiny")
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), response_cache_size=0)
    with ServerThread(lm, sc, cfg) as s:
        c = _client(s)
        a1 = _ask(c, QUESTIONS[0], None)
        a2 = _ask(c, QUESTIONS[1], a1.id)
        b1 = _ask(c, QUESTIONS[0] + " (another chain)", None)
        store = open_store(tmp_path)
        s.state.engine.core.disk.flush()  # (the registry rows are written after each turn, off the loop)
        keys = {x.key for x in store.sessions()}
        assert len(keys) == 2
        c.responses.delete(a2.id)  # a1 still continues the chain's session: its KV stays
        assert {x.key for x in store.sessions()} == keys
        c.responses.delete(a1.id)
        left = store.sessions()
        assert len(left) == 1 and c.responses.retrieve(b1.id).id == b1.id
        kept = set(left[0].records)
        assert {r.id for r in store.kv_all()} >= kept  # b's records (and any it shares) stay
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(a1.id)
        with pytest.raises(openai.NotFoundError):
            _ask(c, "more", a2.id)


def test_two_servers_sharing_a_postgres_store_resolve_an_alternating_chain(embedded_native, postgres_url, tmp_path):
    from tests.conftest import fresh_postgres_db

    lm, sc = embedded_native, ServerConfig(port=0, model_name="tiny")
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), state_url=fresh_postgres_db(postgres_url),
                       response_cache_size=0)
    with ServerThread(lm, sc, cfg) as a, ServerThread(lm, sc, cfg) as b:
        clients, prev, texts = [_client(a), _client(b)], None, []
        for k, q in enumerate(QUESTIONS):
            r = _ask(clients[k % 2], q, prev)
            texts.append(r.output_text)
            prev = r.id
        assert clients[0].responses.retrieve(prev).id == prev  # (stored by b, read by a)
    with ServerThread(lm, sc, EngineConfig(kv_cache_tokens=8192, response_cache_size=0)) as s:
        c, p, want = _client(s), None, []
        for q in QUESTIONS:
            r = _ask(c, q, p)
            want.append(r.output_text)
            p = r.id
    assert texts == want  # (every link saw the whole chain, whichever server answered it)
