"""The test session's PostgreSQL server (conftest.postgres_url, tests/pg_server.py) is a real one:
a session database and fresh per-test databases that do not see each other's tables."""

from __future__ import annotations

import pytest

from tests.conftest import fresh_postgres_db


def test_a_real_server_with_fresh_databases(postgres_url):
    import psycopg

    assert postgres_url.startswith("postgresql://agentrt@127.0.0.1:") and postgres_url.endswith("/agentrt")
    fresh = fresh_postgres_db(postgres_url)
    assert fresh != postgres_url and fresh.rsplit("/", 1)[1].startswith("t_")
    for url in (postgres_url, fresh):
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.execute("SHOW server_version").fetchone()[0][:1].isdigit()
            conn.execute("CREATE TABLE t (k text PRIMARY KEY, v integer)")
            conn.execute("INSERT INTO t VALUES (%s, %s)", ("a", 42))
            assert conn.execute("SELECT v FROM t WHERE k = %s", ("a",)).fetchone() == (42,)
    # the second CREATE TABLE t did not collide with the first: separate databases; a third is empty
    with psycopg.connect(fresh_postgres_db(postgres_url)) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM t")
