"""The engine core's clock: where every "now" of admission, scheduling, retention and task
tracking comes from. The real engine reads the monotonic wall clock; a simulated engine
(agentrt/sim) reads its event loop's clock, which a virtual-time loop advances by the simulated
cost of each step and each tool's latency."""

from __future__ import annotations

import time
from typing import Protocol

import anyio


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""


class WallClock:
    """time.monotonic(): the real engine's clock (any thread)."""

    def now(self) -> float:
        return time.monotonic()


class LoopClock:
    """The running event loop's clock (anyio.current_time): virtual under a simulated run.
    Read only from the loop's thread (the simulated engine steps there)."""

    def now(self) -> float:
        return anyio.current_time()
