"""The dashboard on a background thread: its own uvicorn server and event loop, so a program whose
engine runs on its own loop (or none, between asyncio.run calls) keeps it up without a task of
its own. The socket is bound before the thread starts, so a port in use is a typed error here."""

from __future__ import annotations

import errno
import socket
import threading
import time

from agentrt.dashboard.app import Dashboard, build_app
from agentrt.errors import AgentrtError, ConfigError


class DashboardServer:
    """A running dashboard: `url`, `stop()`; a context manager (stops on exit)."""

    def __init__(self, dashboard: Dashboard, host: str, port: int, *, log_level: str = "warning") -> None:
        import uvicorn

        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        if not isinstance(host, str) or not host:
            raise ConfigError(f"host must be a host name or address, got {host!r}")
        self.dashboard, self.host = dashboard, host
        self._sock = _bind(host, port)
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(build_app(dashboard), log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]},
                                        name="agentrt-dashboard", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 30.0) -> "DashboardServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise AgentrtError("the dashboard server did not start; see its log")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (open event streams are closed) and wait for the thread."""
        self.server.should_exit = True
        self.server.force_exit = True  # (event streams never end by themselves)
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> "DashboardServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(f"port {port} on {host} is in use: pass another port, or port=0 for any free one "
                              "(the chosen one is in .url)") from None
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror}); pass a local address such as "
                          "127.0.0.1") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock
