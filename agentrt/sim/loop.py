"""The simulated engine's step loop: StepThread's command and event machinery, run as a task on
the event loop instead of an OS thread, with the step's simulated cost passed on the loop's
(virtual) clock before its events are delivered.

Run under `agentrt.sim.run` (an asyncio loop whose clock jumps to the next deadline whenever
every task waits): a step planned at virtual time t delivers its tokens at t + its cost, a tool
that sleeps 0.2 s takes 0.2 virtual seconds, and a whole multi-agent workload runs as fast as its
Python bookkeeping allows."""

from __future__ import annotations

import math
from typing import Protocol

import anyio

from agentrt.engine.core import EngineCore
from agentrt.engine.loop import StepThread, deliver_now


class PendingSeconds(Protocol):
    """What the loop reads of a simulated executor (sim/executor.py::SimExecutor)."""

    def take_pending(self) -> float:
        """Simulated seconds charged since the last call (steps and tier copies)."""
        ...


class SimSteps(StepThread):
    def __init__(self, core: EngineCore, executor: PendingSeconds):
        super().__init__(core)
        self._executor = executor  # core's executor, as the seconds it charges
        self._wake = anyio.Event()
        self._done = anyio.Event()

    @property
    def started(self) -> bool:
        return self._portal is not None

    async def begin(self, portal) -> None:
        """Start the loop task in a task group of its own, entered here and left by
        end() (Engine enters and leaves both inside its own `async with`)."""
        self._portal, self._tg = portal, anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._run)

    def start(self, portal) -> None:
        raise RuntimeError("a simulated step loop starts from the event loop: await begin(portal)")

    async def wait_closed(self) -> None:
        await self._done.wait()

    async def end(self) -> None:
        await self._tg.__aexit__(None, None, None)

    def join(self) -> None:  # (nothing to join: the loop task ends on its own)
        pass

    def _notify(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        try:
            await self._serve_async()
        except BaseException as e:  # as StepThread: every caller gets EngineFailed, nothing hangs
            self._die(e)
        finally:
            self._done.set()

    async def _serve_async(self) -> None:
        executor = self._executor
        while True:
            if self._idle():
                wake = self.core.idle()
                await self._pass(executor.take_pending())
                if self._idle():
                    with anyio.move_on_after(wake if wake is not None else math.inf):
                        await self._wake.wait()
            self._wake = anyio.Event()
            if not self._turn(self._next_cmd()):
                return
            await self._pass(executor.take_pending())
            self._flush()

    async def _pass(self, seconds: float) -> None:
        """Let the step's (or copy's) simulated seconds pass, events held until then."""
        if seconds > 0:
            await anyio.sleep(seconds)
        else:
            await anyio.lowlevel.checkpoint()

    def _flush(self) -> None:
        if self._outbox:
            batch, self._outbox = self._outbox, []
            deliver_now(batch)
