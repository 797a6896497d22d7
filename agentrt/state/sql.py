"""The durable state store: one small interface over SQL, SQLite by default, PostgreSQL for
replicas that share it.

Four tables, one owner each:
  * `responses`: the Responses API's stored responses (server/responses/store.py), per tenant,
    with the chain's messages and the key of the session that holds their KV;
  * `sessions`: the sessions' registry: a conversation key, its tenant salt, the model and
    adapter fingerprints, the disk key and length of its token history, the KV records its
    history runs through, its last use (kv/disk.py writes it at each turn's end);
  * `conversations`: an agent's messages by its stable key (runtime/agent.py resumes them);
  * `kv_records`: the index of the disk KV tier's records (kv/disk.py): a record's file
    becomes visible here only after it was written, fsynced and renamed into place.

Every method is one transaction (SQLite: WAL, synchronous=FULL, so a committed row survives
SIGKILL and power loss; PostgreSQL: its own commit). A store is shared by the engine's step and
writer threads and the server's event loop: one connection behind a lock, short statements.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentrt.errors import StateStoreError

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, body TEXT NOT NULL, chain TEXT NOT NULL,
    session_key TEXT, created DOUBLE PRECISION NOT NULL, expires DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS responses_created ON responses (created);
CREATE INDEX IF NOT EXISTS responses_session ON responses (session_key);
CREATE TABLE IF NOT EXISTS sessions (
    key TEXT PRIMARY KEY, tenant TEXT, model TEXT NOT NULL, adapter TEXT, history_key TEXT NOT NULL,
    n_tokens INTEGER NOT NULL, records TEXT NOT NULL, last_use DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    key TEXT PRIMARY KEY, messages TEXT NOT NULL, updated DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS kv_records (
    id TEXT PRIMARY KEY, parent TEXT NOT NULL, start INTEGER NOT NULL, n INTEGER NOT NULL,
    tokens {blob} NOT NULL, nbytes BIGINT NOT NULL, tag TEXT, last_use DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS kv_records_parent ON kv_records (parent);
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str
    tenant: str
    body: dict
    chain: list[dict]  # the chain's messages through this response's output
    session_key: str | None
    expires: float  # wall-clock seconds (time.time())


@dataclass(frozen=True)
class SessionRow:
    """A session's entry in the registry: what its KV is and where it lies on disk."""

    key: str
    tenant: str | None
    model: str
    adapter: str | None
    history_key: str  # the disk key of its whole token history (kv/disk.py)
    n_tokens: int
    records: tuple[str, ...]  # the KV records its history runs through, in order
    last_use: float


@dataclass(frozen=True)
class KVRow:
    """A disk KV record's index row: tokens [start, start + n) after the prefix whose key is
    `parent`, its file's size, who wrote it, when it was last read or written."""

    id: str
    parent: str
    start: int
    n: int
    tokens: bytes  # int32 little-endian token ids
    nbytes: int
    tag: str | None
    last_use: float

    @property
    def last_access(self) -> float:  # (what an eviction policy reads: kv/eviction.py)
        return self.last_use

    @property
    def num_pages(self) -> int:
        return self.n


class SQLStore:
    """The state store over one DB-API connection; subclasses open it and name the dialect."""

    blob = "BLOB"
    mark = "?"  # the driver's placeholder

    def __init__(self, conn, where: str) -> None:
        self.conn, self.where = conn, where
        self.lock = threading.Lock()
        self.closed = False
        with self._tx() as cur:
            for stmt in SCHEMA.format(blob=self.blob).split(";"):
                if stmt.strip():
                    cur.execute(stmt)

    # ---- plumbing ---------------------------------------------------------------------
    def _q(self, sql: str) -> str:
        return sql.replace("?", self.mark)

    def _tx(self):
        return _Transaction(self)

    def _rows(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self._tx() as cur:
            cur.execute(self._q(sql), tuple(args))
            return list(cur.fetchall())

    def _run(self, sql: str, args: Sequence = ()) -> int:
        with self._tx() as cur:
            cur.execute(self._q(sql), tuple(args))
            return cur.rowcount

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self.conn.close()

    # ---- responses --------------------------------------------------------------------
    def put_response(self, r: StoredResponse, max_count: int) -> None:
        """Store r, then keep the newest `max_count` (and drop the expired), in one transaction."""
        now = time.time()
        with self._tx() as cur:
            cur.execute(self._q("DELETE FROM responses WHERE id = ?"), (r.id,))
            cur.execute(self._q("INSERT INTO responses (id, tenant, body, chain, session_key, created, expires) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?)"),
                        (r.id, r.tenant, json.dumps(r.body), json.dumps(r.chain), r.session_key, now, r.expires))
            cur.execute(self._q("DELETE FROM responses WHERE expires < ?"), (now,))
            cur.execute(self._q("SELECT COUNT(*) FROM responses"))
            extra = cur.fetchone()[0] - max_count
            if extra > 0:
                cur.execute(self._q("DELETE FROM responses WHERE id IN (SELECT id FROM responses ORDER BY created "
                                    "LIMIT ?)"), (extra,))

    def get_response(self, tenant: str, rid: str) -> StoredResponse | None:
        """The tenant's unexpired response `rid` (None: unknown, expired or another tenant's)."""
        rows = self._rows("SELECT id, tenant, body, chain, session_key, expires FROM responses WHERE id = ? "
                          "AND tenant = ? AND expires >= ?", (rid, tenant, time.time()))
        if not rows:
            return None
        i, t, body, chain, key, exp = rows[0]
        return StoredResponse(i, t, json.loads(body), json.loads(chain), key, exp)

    def delete_response(self, tenant: str, rid: str) -> bool:
        return self._run("DELETE FROM responses WHERE id = ? AND tenant = ?", (rid, tenant)) > 0

    def responses_of_session(self, key: str) -> int:
        return self._rows("SELECT COUNT(*) FROM responses WHERE session_key = ?", (key,))[0][0]

    def count_responses(self) -> int:
        return self._rows("SELECT COUNT(*) FROM responses")[0][0]

    # ---- the sessions' registry -------------------------------------------------------
    def put_session(self, s: SessionRow) -> None:
        with self._tx() as cur:
            cur.execute(self._q("DELETE FROM sessions WHERE key = ?"), (s.key,))
            cur.execute(self._q("INSERT INTO sessions (key, tenant, model, adapter, history_key, n_tokens, records, "
                                "last_use) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                        (s.key, s.tenant, s.model, s.adapter, s.history_key, s.n_tokens, json.dumps(s.records),
                         s.last_use))

    def get_session(self, key: str) -> SessionRow | None:
        rows = self._rows("SELECT key, tenant, model, adapter, history_key, n_tokens, records, last_use FROM sessions "
                          "WHERE key = ?", (key,))
        return _session(rows[0]) if rows else None

    def sessions(self) -> list[SessionRow]:
        return [_session(r) for r in self._rows("SELECT key, tenant, model, adapter, history_key, n_tokens, "
                                                "records, last_use FROM sessions ORDER BY last_use")]

    def delete_session(self, key: str) -> SessionRow | None:
        """Remove the session's row; returns it (None: there was none)."""
        row = self.get_session(key)
        if row is not None:
            self._run("DELETE FROM sessions WHERE key = ?", (key,))
        return row

    # ---- conversations ----------------------------------------------------------------
    def put_conversation(self, key: str, messages: list[dict]) -> None:
        with self._tx() as cur:
            cur.execute(self._q("DELETE FROM conversations WHERE key = ?"), (key,))
            cur.execute(self._q("INSERT INTO conversations (key, messages, updated) VALUES (?, ?, ?)"),
                        (key, json.dumps(messages), time.time()))

    def get_conversation(self, key: str) -> list[dict] | None:
        rows = self._rows("SELECT messages FROM conversations WHERE key = ?", (key,))
        return json.loads(rows[0][0]) if rows else None

    def delete_conversation(self, key: str) -> None:
        self._run("DELETE FROM conversations WHERE key = ?", (key,))

    # ---- the disk KV tier's index -----------------------------------------------------
    def kv_children(self, parent: str) -> list[KVRow]:
        return [_kv(r) for r in self._rows("SELECT id, parent, start, n, tokens, nbytes, tag, last_use FROM "
                                           "kv_records WHERE parent = ?", (parent,))]

    def kv_get(self, ids: Iterable[str]) -> list[KVRow]:
        ids = list(ids)
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        return [_kv(r) for r in self._rows(f"SELECT id, parent, start, n, tokens, nbytes, tag, last_use FROM "
                                           f"kv_records WHERE id IN ({marks})", ids)]

    def kv_put(self, row: KVRow) -> bool:
        """Index a record (its file is in place); False when a record of that id was there."""
        with self._tx() as cur:
            cur.execute(self._q("SELECT 1 FROM kv_records WHERE id = ?"), (row.id,))
            if cur.fetchone() is not None:
                return False
            cur.execute(self._q("INSERT INTO kv_records (id, parent, start, n, tokens, nbytes, tag, last_use) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                        (row.id, row.parent, row.start, row.n, row.tokens, row.nbytes, row.tag, row.last_use))
            return True

    def kv_touch(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if ids:
            marks = ", ".join("?" * len(ids))
            self._run(f"UPDATE kv_records SET last_use = ? WHERE id IN ({marks})", [time.time(), *ids])

    def kv_delete(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        if ids:
            marks = ", ".join("?" * len(ids))
            self._run(f"DELETE FROM kv_records WHERE id IN ({marks})", ids)

    def kv_bytes(self) -> int:
        return int(self._rows("SELECT COALESCE(SUM(nbytes), 0) FROM kv_records")[0][0])

    def kv_all(self) -> list[KVRow]:
        """Every record's row without its tokens (eviction ranks them; a sweep lists them)."""
        return [_kv((*r[:4], b"", *r[4:])) for r in self._rows(
            "SELECT id, parent, start, n, nbytes, tag, last_use FROM kv_records")]


class _Transaction:
    """`with store._tx() as cur`: one locked transaction, committed on success, rolled back on
    error; a driver's error becomes StateStoreError naming the store."""

    def __init__(self, store: SQLStore) -> None:
        self.store = store

    def __enter__(self):
        self.store.lock.acquire()
        if self.store.closed:
            self.store.lock.release()
            raise StateStoreError(f"the state store at {self.store.where} is closed")
        self.cur = self.store.conn.cursor()
        return self.cur

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None:
                self.store.conn.commit()
            else:
                self.store.conn.rollback()
        finally:
            self.cur.close()
            self.store.lock.release()
        if exc is not None and not isinstance(exc, StateStoreError) and _driver_error(exc):
            raise StateStoreError(f"the state store at {self.store.where} failed ({type(exc).__name__}: "
                                  f"{str(exc)[:200]})") from exc


def _driver_error(exc: BaseException) -> bool:
    mod = type(exc).__module__
    return isinstance(exc, sqlite3.Error) or mod.startswith("psycopg")


def _session(r: tuple) -> SessionRow:
    return SessionRow(r[0], r[1], r[2], r[3], r[4], int(r[5]), tuple(json.loads(r[6])), float(r[7]))


def _kv(r: tuple) -> KVRow:
    return KVRow(r[0], r[1], int(r[2]), int(r[3]), bytes(r[4]), int(r[5]), r[6], float(r[7]))
