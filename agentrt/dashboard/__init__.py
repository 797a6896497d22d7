"""A live dashboard of an in-process engine: agents and their sessions, the KV pool and tier over
time, hit rate, queue depth, a per-turn timeline and the workflow DAG (the `server` extra).

    async with Engine(model) as engine, Runtime(engine) as rt:
        board = agentrt.dashboard.serve(rt, port=8265)   # a background thread; board.url
        ...
        board.stop()

`agentrt serve --dashboard` adds the same page to the server at /dashboard/, and
`agentrt dashboard` runs a small multi-agent workload with it. The page is static (no build
step; uPlot vendored under static/vendor) and updates from server-sent events carrying the
numbers of `engine.stats()` with what they sum (app.py, snapshot.py). Nothing is sampled while
nobody watches; a sample reads the core between two steps.
"""

from __future__ import annotations

from typing import Any

from agentrt.errors import ConfigError

__all__ = ["Dashboard", "DashboardServer", "build_app", "serve"]

DEFAULT_PORT = 8265
_LAZY = {"Dashboard": "app", "build_app": "app", "DashboardServer": "server"}  # (Starlette and uvicorn)


def serve(target: Any, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, interval: float = 1.0,
          log_level: str = "warning") -> Any:
    """Serve the dashboard of `target` (an Engine or a Runtime, or a callable returning one) on
    host:port from a background thread, started when this returns (a `DashboardServer`: `.url`,
    `.stop()`, a `with` block); port=0 picks a free port. ConfigError for a port in use."""
    return __getattr__("DashboardServer")(__getattr__("Dashboard")(target, interval=interval), host, port,
                                          log_level=log_level).start()


def __getattr__(name: str) -> Any:
    """The app and server classes, imported on first use: `import agentrt` does not need the
    server extra, the dashboard does."""
    if name not in _LAZY:
        raise AttributeError(f"module 'agentrt.dashboard' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(f"agentrt.dashboard.{_LAZY[name]}")
    except ImportError as e:
        raise ConfigError(f"the dashboard needs the server extra: pip install 'agentrt[server]' ({e})") from None
    return getattr(module, name)
