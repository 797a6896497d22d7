"""Running a simulated workload: a trio event loop whose clock is virtual (trio's MockClock with
autojump: whenever every task waits, time jumps to the next deadline). Everything awaited in
`main` -- engine steps (SimSteps sleeps each step's cost), tools that sleep, arrivals -- takes
virtual time; `anyio.current_time()` reads it. Nothing may wait on a thread (a sync tool run in a
worker thread would let the clock jump past it): tools in a simulation are async."""

from __future__ import annotations

import anyio


def run(main, *args):
    """anyio.run(main, *args) on trio with a virtual clock; returns main's result."""
    from trio.testing import MockClock

    return anyio.run(main, *args, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
