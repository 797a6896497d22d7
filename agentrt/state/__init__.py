"""Durable state (issue 59): the state store (state/sql.py: SQLite by default, PostgreSQL for
replicas) and the disk KV tier's record files (state/records.py)."""

from agentrt.state.sql import KVRow, PostgresStore, SessionRow, SQLiteStore, SQLStore, StoredResponse, open_store

__all__ = ["KVRow", "PostgresStore", "SQLStore", "SQLiteStore", "SessionRow", "StoredResponse", "open_store"]
