"""A throwaway PostgreSQL server for the state store's tests and bench_restart's postgres part:
Debian's postgresql (installed by .ci/ensure_postgres), a cluster in a temporary directory,
trust authentication on 127.0.0.1 and a free port, stopped and removed on exit. Where it cannot
run, `url` is None and `why` says why (the caller skips, never fakes)."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path


def _bins() -> tuple[str, str] | None:
    """(initdb, pg_ctl) of one installation: on PATH, else the newest /usr/lib/postgresql/*/bin."""
    initdb = shutil.which("initdb")
    if initdb:  # pg_ctl of the same version: beside initdb's real path (a symlink on PATH), else on PATH
        beside = Path(os.path.realpath(initdb)).parent / "pg_ctl"
        pg_ctl = str(beside) if os.access(beside, os.X_OK) else shutil.which("pg_ctl")
        if pg_ctl:
            return initdb, pg_ctl
    def version(d: str) -> int:
        return int(Path(d).parent.name) if Path(d).parent.name.isdigit() else 0

    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if all(os.access(Path(d) / b, os.X_OK) for b in ("initdb", "pg_ctl")):
            return str(Path(d) / "initdb"), str(Path(d) / "pg_ctl")
    return None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_database(url: str, name: str | None = None) -> str:
    """A new empty database on the server of `url` (a unique name by default); its URL."""
    import psycopg

    name = name or f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + f"/{name}"


class PostgresServer:
    """`with PostgresServer() as pg:` pg.url (postgresql://agentrt@127.0.0.1:PORT/agentrt) or
    pg.why. Starts in about a second (initdb --no-sync, fsync=off)."""

    def __init__(self) -> None:
        self.url: str | None = None
        self.why = ""
        self._dir: str | None = None
        self._ctl: list[str] = []

    def __enter__(self) -> "PostgresServer":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        bins = _bins()
        if bins is None:
            self.why = ("PostgreSQL is not installed (initdb/pg_ctl not found; `bash .ci/ensure_postgres` installs "
                        "Debian's postgresql as root): the PostgreSQL backend's tests need a real server")
            return
        initdb, pg_ctl = bins
        as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root: the postgres user of Debian's package runs it
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                self.why = ("running as root, and there is no `postgres` user to run PostgreSQL as "
                            "(PostgreSQL refuses to run as root; Debian's postgresql package creates that user)")
                return
            if not shutil.which("runuser"):
                self.why = "running as root without runuser (util-linux) to run PostgreSQL as the postgres user"
                return
            as_user = ["runuser", "-u", "postgres", "--"]
        self._dir = tempfile.mkdtemp(prefix="agentrt-pg-")
        if as_user:  # (fresh and empty: the directory itself is all there is to hand over)
            os.chmod(self._dir, 0o700)
            os.chown(self._dir, pw.pw_uid, pw.pw_gid)
        data = f"{self._dir}/data"

        def run(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([*as_user, *args], capture_output=True, text=True, cwd=self._dir, timeout=60)

        init = run(initdb, "-D", data, "-A", "trust", "-U", "agentrt", "--no-sync", "-E", "UTF8", "--locale=C")
        if init.returncode:
            self.why = f"initdb failed ({initdb}): {(init.stderr or init.stdout).strip()[-400:]}"
            return
        self._ctl = [*as_user, pg_ctl, "-D", data]  # (set first: a start that half-happened is stopped too)
        for attempt in range(3):  # (a free port can be taken between _port() and the server's bind)
            port, log = _port(), Path(f"{self._dir}/server-{attempt}.log")
            opts = f"-p {port} -k {self._dir} -c listen_addresses=127.0.0.1 -c fsync=off"
            start = run(pg_ctl, "-D", data, "-w", "-t", "30", "-o", opts, "-l", str(log), "start")
            tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else []
            if start.returncode == 0 or not any("already in use" in line for line in tail):
                break
        if start.returncode:
            tail_text = "\n".join(tail) or (start.stderr or start.stdout).strip()[-400:]
            self.why = f"PostgreSQL did not start (pg_ctl start exited {start.returncode}); its log ends:\n{tail_text}"
            return
        self.url = create_database(f"postgresql://agentrt@127.0.0.1:{port}/postgres", "agentrt")

    def __exit__(self, *exc) -> None:
        if self._ctl:
            subprocess.run([*self._ctl, "-m", "immediate", "stop"], capture_output=True, cwd=self._dir, timeout=60)
            self._ctl = []
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
