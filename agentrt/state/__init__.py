"""Durable state (issue 59): the state store (state/sql.py: its SQL; state/backends.py: SQLite by
default, PostgreSQL for replicas) and the disk KV tier's record files (state/records.py)."""

from agentrt.state.backends import PostgresStore, SQLiteStore, open_store
from agentrt.state.sql import KVRow, SessionRow, SQLStore, StoredResponse

__all__ = ["KVRow", "PostgresStore", "SQLStore", "SQLiteStore", "SessionRow", "StoredResponse", "open_store"]
