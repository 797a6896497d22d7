"""Running the app: `serve()` in the foreground (the CLI), `ServerThread` in the background
(tests, benchmarks, notebooks)."""

from __future__ import annotations

import threading
import time

import uvicorn

from agentrt.errors import AgentrtError

from .app import build_app
from .config import ServerConfig


def _server(model, config: ServerConfig, engine_config, log_level: str) -> uvicorn.Server:
    app = build_app(model, config, engine_config)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=log_level,
                                         timeout_graceful_shutdown=5, lifespan="on"))


def serve(model, config: ServerConfig | None = None, engine_config=None, *, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C)."""
    _server(model, config or ServerConfig(), engine_config, log_level).run()


class ServerThread:
    """The server on a background thread: `with ServerThread(model, ServerConfig(port=0)) as s:`
    then `s.url` (e.g. http://127.0.0.1:54321/v1 for an OpenAI client's base_url)."""

    def __init__(self, model, config: ServerConfig | None = None, engine_config=None, *,
                 log_level: str = "warning", start_timeout: float = 120.0) -> None:
        self.config = config or ServerConfig(port=0)
        self.server = _server(model, self.config, engine_config, log_level)
        self._thread = threading.Thread(target=self.server.run, name="agentrt-server", daemon=True)
        self._start_timeout = start_timeout

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def base_url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1"

    @property
    def state(self):
        return self.server.config.app.state.agentrt

    def start(self) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise AgentrtError("the server did not start; see its log")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
