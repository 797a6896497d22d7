"""The state store's two backends (state/sql.py holds their shared SQL): SQLite, one file in the
state dir, and PostgreSQL through psycopg 3, one store for every replica; `open_store` picks
one from an engine's or server's settings."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agentrt.errors import StateStoreError
from agentrt.state.sql import SQLStore


class SQLiteStore(SQLStore):
    """One SQLite file (`<state_dir>/state.db`), in WAL mode with synchronous=FULL: readers never
    wait for the writer, and a commit is on disk when it returns. Several processes may open it."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level="DEFERRED")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        except (OSError, sqlite3.Error) as e:
            raise StateStoreError(f"cannot open the state store {path} ({type(e).__name__}: {e}); give a "
                                  "writable directory as EngineConfig.state_dir / --state-dir") from None
        super().__init__(conn, str(path))


class PostgresStore(SQLStore):
    """PostgreSQL through psycopg 3 (`--state-url postgresql://...`): one store shared by every
    replica, so a response chain started on one continues on another."""

    blob = "BYTEA"
    mark = "%s"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise StateStoreError("a postgresql:// state URL needs psycopg 3: pip install 'agentrt[postgres]'") \
                from None
        try:
            conn = psycopg.connect(url, connect_timeout=10)
        except psycopg.Error as e:
            raise StateStoreError(f"cannot connect to the state store {_redact(url)} ({str(e).strip()[:200]}); "
                                  "check the URL and that the server is up") from None
        super().__init__(conn, _redact(url))


def _redact(url: str) -> str:
    """The URL without its password (error messages, logs)."""
    head, sep, tail = url.partition("@")
    if not sep or ":" not in head.split("//", 1)[-1]:
        return url
    scheme, _, cred = head.partition("//")
    return f"{scheme}//{cred.split(':', 1)[0]}:***@{tail}"


def open_store(state_dir: str | Path | None = None, state_url: str | None = None) -> SQLStore | None:
    """The store named by an engine's or server's settings: PostgreSQL at `state_url`, else
    SQLite in `state_dir`, else None (nothing is kept across restarts)."""
    if state_url:
        if not state_url.startswith(("postgresql://", "postgres://")):
            raise StateStoreError(f"state_url must be a postgresql:// URL, got {_redact(state_url)!r} (SQLite needs "
                                  "no URL: give state_dir alone)")
        return PostgresStore(state_url)
    if state_dir:
        return SQLiteStore(Path(state_dir) / "state.db")
    return None
