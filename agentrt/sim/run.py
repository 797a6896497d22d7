"""Running a simulated workload: anyio on asyncio with an event loop whose clock is virtual
(`VirtualTimeLoop`: whenever every task waits, time jumps to the next deadline). Everything
awaited in `main` -- engine steps (SimSteps sleeps each step's cost), tools that sleep, arrivals --
takes virtual time; `anyio.current_time()` reads it (the loop's `time()`). Nothing may wait on a
thread: a sync tool run in a worker thread would let the clock jump past it, so tools in a
simulation are async. Built from public asyncio API only (a SelectorEventLoop subclass that
overrides `time()`, handed a `selectors.BaseSelector` of its own).

Deterministic by construction, which the simulator needs (identical simulations must agree, so
that paired policy comparisons differ only by the policies; under trio, which wakes the tasks of
one instant in random order, two stages released by one predecessor reached the engine in either
order and LPM's mean JCT was 20.4 or 21.1 s on the same tasks). asyncio runs ready callbacks
first in, first out: tasks woken at one instant run in the order they were woken. Timers are a
heap keyed by deadline alone; timers due at one instant (deadlines within the clock's resolution)
leave it in an order that is a pure function of the sequence of pushes and pops, so with every
callback run in a fixed order that order is fixed too (not first in, first out, but the same
every run). The clock moves only when the loop selects with nothing ready, by the loop's own
wait to the earliest deadline, so time too is a function of the run alone. What stays outside
this: anyio delivers a cancellation to the tasks of one scope in set order (by object
identity), so a workload whose figures depend on the order in which sibling tasks see one
cancellation is not covered; simulations cancel only past their results (timeouts, teardown)."""

from __future__ import annotations

import asyncio
import selectors

import anyio


class VirtualClock:
    """The simulated time: starts at 0 and moves only by advance()."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


class AutojumpSelector(selectors.BaseSelector):
    """A real selector (the loop's self-pipe keeps working, so call_soon_threadsafe wakes the
    loop) whose waits take virtual time: a wait with a timeout and nothing ready returns at once,
    the clock moved on by the timeout (autojump); a wait with no timeout blocks for real."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.real = selectors.DefaultSelector()

    def select(self, timeout: float | None = None):
        ready = self.real.select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        if timeout is None:  # (no timer at all: only another thread can wake the loop)
            return self.real.select(None)
        self.clock.advance(timeout)
        return []

    def register(self, fileobj, events, data=None):
        return self.real.register(fileobj, events, data)

    def unregister(self, fileobj):
        return self.real.unregister(fileobj)

    def modify(self, fileobj, events, data=None):
        return self.real.modify(fileobj, events, data)

    def get_key(self, fileobj):
        return self.real.get_key(fileobj)

    def get_map(self):
        return self.real.get_map()

    def close(self) -> None:
        self.real.close()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on a VirtualClock: `time()` (what call_later, asyncio.sleep and
    anyio.current_time read) is virtual, and every wait for a timer jumps straight to it."""

    def __init__(self) -> None:
        self.virtual_clock = VirtualClock()
        super().__init__(AutojumpSelector(self.virtual_clock))

    def time(self) -> float:
        return self.virtual_clock.now


def run(main, *args):
    """anyio.run(main, *args) on asyncio with a virtual clock (VirtualTimeLoop); returns main's
    result. Deterministic without a seed (above)."""
    return anyio.run(main, *args, backend="asyncio", backend_options={"loop_factory": VirtualTimeLoop})
