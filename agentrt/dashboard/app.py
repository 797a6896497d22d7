"""The dashboard's ASGI app: one static page and its data.

    GET /                 the page (static/index.html; relative links, so it can be mounted anywhere)
    GET /static/...       its script, style and the vendored chart library
    GET /api/snapshot     one snapshot (JSON): stats(), sessions, tree, workflows, agents, turns, history
    GET /api/events       the same as server-sent events, one `snapshot` event per interval

Sampling happens only while someone watches: each SSE stream asks for a snapshot every interval,
and the `Dashboard` hands every stream the one taken in the last half interval (a bounded history
of chart points, the same for every viewer). Reads of the engine run in a worker thread under its
step lock (Engine.inspect), never on the event loop, which may be the engine's own.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from starlette.applications import Starlette
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentrt.conversation.timeline import timeline_of
from agentrt.dashboard.snapshot import engine_state, point, runtime_state
from agentrt.engine.engine import Engine
from agentrt.errors import ConfigError
from agentrt.runtime.runtime import Runtime

STATIC = Path(__file__).parent / "static"


class Dashboard:
    """The data behind the page for `target`: an Engine, a Runtime (its engine and its actors), or
    a zero-argument callable returning one (resolved at each sample: the server's engine exists
    only once the app has started). `interval`: seconds between samples; `history`: chart points
    kept; `turns`: turns shown on the timeline."""

    def __init__(self, target: Any, *, interval: float = 1.0, history: int = 600, turns: int = 40) -> None:
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not 0.05 <= interval <= 60:
            raise ConfigError(f"interval must be a number of seconds in [0.05, 60], got {interval!r}")
        for name, v in (("history", history), ("turns", turns)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        if not callable(target):
            _split(target)  # (a bad target fails here, not at the first sample)
        self.target, self.interval, self.turns = target, float(interval), turns
        self.origin = time.monotonic()
        self.history: deque[dict] = deque(maxlen=history)
        self._last: tuple[float, dict] | None = None
        self._lock = threading.Lock()

    def sample(self) -> dict:
        """A snapshot, fresh or taken in the last half interval (blocking: call it in a thread)."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.interval / 2:
                return self._last[1]
            snap = self._take(now)
            self.history.append(point(snap["t"], snap["stats"]))
            snap["history"] = list(self.history)
            self._last = (now, snap)
            return snap

    def _take(self, now: float) -> dict:
        engine, runtime = _split(self.target() if callable(self.target) else self.target)
        snap = engine.inspect(engine_state) if engine is not None else _no_engine()
        snap["t"] = now - self.origin
        snap["model"] = engine.model_name if engine is not None else None
        snap["agents"] = runtime_state(runtime) if runtime is not None else []
        log = timeline_of(engine) if engine is not None else None
        snap["turns"] = [r.as_dict(self.origin) for r in log.recent(self.turns)] if log is not None else []
        return snap

    async def events(self) -> AsyncIterator[str]:
        """The SSE stream: a snapshot now (with the chart history), then one per interval (with
        its new chart point), until the client leaves."""
        first = True
        while True:
            snap = await anyio.to_thread.run_sync(self.sample)
            if not first:
                snap = {**{k: v for k, v in snap.items() if k != "history"}, "point": snap["history"][-1]}
            first = False
            yield f"event: snapshot\ndata: {_json(snap)}\n\n"
            await anyio.sleep(self.interval)


def _split(target: Any) -> tuple[Any, Any]:
    """(engine, runtime) of a target; ConfigError for anything else."""
    if target is None:
        return None, None
    if isinstance(target, Runtime):  # (its engine: an in-process Engine, else not shown)
        return (target.engine if isinstance(target.engine, Engine) else None), target
    if isinstance(target, Engine):
        return target, None
    raise ConfigError(f"the dashboard shows an in-process Engine or Runtime, got {type(target).__name__}; "
                      "pass the Engine (or the Runtime) your agents run on")


def _no_engine() -> dict:
    from agentrt.engine.stats import Counters  # (the zeros of every number, for an engine-less runtime)

    zero = {k: 0 for k in vars(Counters())}
    stats = {**zero, "waiting": 0, "running": 0, "sessions": 0, "pages_total": 0, "pages_free": 0,
             "pages_cached_only": 0, "tier_pages": 0, "hit_rate": 0.0, "kv_occupancy": 0.0}
    return {"stats": stats, "page_size": 0, "sessions": [], "tree": {}, "workflows": []}


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=_default)


def _default(x: Any) -> Any:
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return str(x)


def build_app(dashboard: Dashboard) -> Starlette:
    """The ASGI app serving `dashboard` (mount it, e.g. at /dashboard, or run it with uvicorn)."""

    async def page(request):
        return FileResponse(STATIC / "index.html", media_type="text/html")

    async def snapshot(request):
        snap = await anyio.to_thread.run_sync(dashboard.sample)
        return JSONResponse(json.loads(_json(snap)))

    async def events(request):
        return StreamingResponse(dashboard.events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return Starlette(routes=[Route("/", page), Route("/api/snapshot", snapshot), Route("/api/events", events),
                             Mount("/static", StaticFiles(directory=STATIC), name="static")])
