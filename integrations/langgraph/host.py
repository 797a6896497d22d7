"""EngineHost: runs generations on the event loop that owns the engine, for callers on any
loop or thread.

An `Engine` delivers token events to the loop it was entered in, so every generation must run
there. Callers differ: `ainvoke` inside that loop (the common case: the graph and the engine
share one loop) runs directly; `ainvoke` from another loop and the sync `invoke`/`stream`
(LangGraph's sync API runs nodes in worker threads) go through the engine's BlockingPortal
and get the items back through a queue.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.from_thread

from agentrt.engine.like import EngineLike
from agentrt.errors import ConfigError

_END, _ITEM, _ERROR = "end", "item", "error"


class EngineHost:
    """Owns or borrows an `Engine` and the portal into its loop."""

    def __init__(self, engine: EngineLike, portal_cm=None, *, outer=None, served=None, stop=None):
        self.engine = engine
        self._portal_cm = portal_cm  # set when this host started the loop (from_model)
        # (start() only: the private loop's portal, the engine task's future, its stop event)
        self._outer, self._served, self._stop = outer, served, stop

    @classmethod
    def start(cls, make_engine: Callable[[], EngineLike]) -> "EngineHost":
        """Start a private event loop in a thread and run a new engine there (until close())."""
        cm = anyio.from_thread.start_blocking_portal()
        portal = cm.__enter__()
        try:
            engine = make_engine()
            served, stop = portal.start_task(_serve, engine)
        except BaseException:
            cm.__exit__(None, None, None)
            raise
        return cls(engine, cm, outer=portal, served=served, stop=stop)

    @property
    def owns_engine(self) -> bool:
        """True while this host runs an engine it started (from_model) and has not closed."""
        return self._portal_cm is not None

    @property
    def portal(self):
        p = self.engine.portal
        if p is None:
            raise ConfigError("the engine is not started: use it inside `async with Engine(...)` or "
                              "create the model with ChatAgentrt.from_model(...)")
        return p

    def close(self) -> None:
        """Close an engine this host started (no-op for a borrowed engine)."""
        if self._portal_cm is not None:
            cm, self._portal_cm = self._portal_cm, None
            self._outer.call(self._stop.set)
            self._served.result()
            cm.__exit__(None, None, None)

    # ---- running generations ------------------------------------------------------------
    async def astream(self, agen_fn: Callable[[], AsyncIterator[Any]]) -> AsyncIterator[Any]:
        """Iterate agen_fn() on the engine's loop, from the caller's loop."""
        if self._on_engine_thread():  # one thread runs one loop: this is the engine's
            async for item in agen_fn():
                yield item
            return
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        fut = self.portal.start_task_soon(_produce, agen_fn, lambda x: loop.call_soon_threadsafe(q.put_nowait, x))
        try:
            while (item := _unwrap(await q.get())) is not _DONE:
                yield item
        finally:
            fut.cancel()

    def stream(self, agen_fn: Callable[[], AsyncIterator[Any]]) -> Iterator[Any]:
        """Iterate agen_fn() on the engine's loop, from a thread without that loop."""
        if self._on_engine_thread():
            raise ConfigError("a sync call (invoke/stream) on the event loop that runs the engine would "
                              "deadlock it; use ainvoke/astream there")
        q: queue.SimpleQueue = queue.SimpleQueue()
        fut = self.portal.start_task_soon(_produce, agen_fn, q.put)
        try:
            while (item := _unwrap(q.get())) is not _DONE:
                yield item
        finally:
            fut.cancel()

    def _on_engine_thread(self) -> bool:
        # (self.portal: ConfigError when the engine is not started)
        return self.portal is not None and self.engine.loop_thread_id == threading.get_ident()


_DONE = object()


def _unwrap(message: tuple[str, Any]) -> Any:
    """A producer message -> its item; _DONE at the end; the producer's error is raised here."""
    kind, value = message
    if kind == _ERROR:
        raise value
    return _DONE if kind == _END else value


async def _serve(engine, *, task_status) -> None:
    """The engine's lifetime on the host loop: entered and closed in this one task."""
    stop = anyio.Event()
    async with engine:
        task_status.started(stop)
        await stop.wait()


async def _produce(agen_fn, put) -> None:
    try:
        async for item in agen_fn():
            put((_ITEM, item))
        put((_END, None))
    except anyio.get_cancelled_exc_class():
        put((_END, None))
        raise
    except BaseException as exc:  # handed to the consumer
        put((_ERROR, exc))
