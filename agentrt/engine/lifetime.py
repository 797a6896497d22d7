"""Where an engine's event-loop side lives: its blocking portal (how the step thread delivers
events to the loop, and other threads call into it) and whatever its step loop enters
(`StepThread.begin`: a task group for the simulated loop).

Both sit in a task of their own on the engine's event loop -- a trio system task, or an asyncio
task -- instead of in the caller's task. So no cancel scope of the engine is ever entered in the
caller's task, and `Engine.aclose()` ends the engine completely from wherever it is called: the
task that entered it, inside any task group or cancel scope, or another task. (With the portal
entered in the caller's task, an aclose() before the caller's task group exited left the
portal's scope open under it: "Attempted to exit a cancel scope that isn't the current task's
current cancel scope".)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import sniffio
from anyio.from_thread import BlockingPortal

from agentrt.errors import ConfigError


class EngineHost:
    """Runs `begin(portal)` in a host task with a fresh portal, and keeps both until stop()."""

    def __init__(self) -> None:
        self.portal: BlockingPortal | None = None
        self._stop: anyio.Event | None = None
        self._gone: anyio.Event | None = None
        self._ended: list[BaseException] = []  # what end() raised, for stop()'s caller
        self._task = None  # the asyncio host task (the loop keeps only weak references to tasks)

    @property
    def entered(self) -> bool:
        return self._gone is not None

    async def start(self, begin: Callable[[BlockingPortal], Awaitable[None]],
                    end: Callable[[], Awaitable[None]]) -> BlockingPortal:
        """Start the host task; returns once `begin(portal)` returned there (raising what it
        raised). `end()` runs in the host task when stop() is called, before the portal closes."""
        ready, stop, gone = anyio.Event(), anyio.Event(), anyio.Event()
        self._stop, self._gone = stop, gone
        failed: list[BaseException] = []

        async def host() -> None:
            try:
                async with BlockingPortal() as portal:
                    try:
                        await begin(portal)
                    except BaseException as e:  # (reported to start()'s caller)
                        failed.append(e)
                        return
                    self.portal = portal
                    ready.set()
                    try:
                        await stop.wait()
                    finally:  # (at begin's nesting: what begin entered is left in its scope)
                        try:
                            await end()
                        except Exception as e:
                            self._ended.append(e)
            finally:
                ready.set()
                gone.set()

        self._task = _spawn(host)
        await ready.wait()
        if failed or self.portal is None:
            await gone.wait()
            raise failed[0] if failed else ConfigError("the engine's host task ended before it started")
        return self.portal

    async def stop(self) -> None:
        """End the host task (begin's counterpart, then the portal) and wait for it; idempotent,
        callable from any task on the engine's loop, shielded from the caller's cancellation."""
        if self._gone is None or self._stop is None:
            return
        with anyio.CancelScope(shield=True):
            self._stop.set()
            await self._gone.wait()
        if self._ended:
            raise self._ended.pop()


def _spawn(fn: Callable[[], Coroutine[Any, Any, None]]):
    """Run fn() in a task that belongs to no caller's task group; returns the asyncio task
    (the caller keeps it alive) or None (trio's system tasks are the run's own)."""
    lib = sniffio.current_async_library()
    if lib == "trio":
        import trio

        trio.lowlevel.spawn_system_task(_system(fn), name="agentrt-engine-host")
        return None
    if lib == "asyncio":
        import asyncio

        return asyncio.get_running_loop().create_task(fn(), name="agentrt-engine-host")
    else:
        raise ConfigError(f"the engine runs on asyncio or trio, not {lib!r}")


def _system(fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """A trio system task must not raise (it would end the run as TrioInternalError): the
    run's end cancels it, which is how an engine never closed is left."""
    async def run() -> None:
        try:
            await fn()
        except anyio.get_cancelled_exc_class():
            pass
    return run
