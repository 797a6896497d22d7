"""Running a simulated workload: a trio event loop whose clock is virtual (trio's MockClock with
autojump: whenever every task waits, time jumps to the next deadline). Everything awaited in
`main` -- engine steps (SimSteps sleeps each step's cost), tools that sleep, arrivals -- takes
virtual time; `anyio.current_time()` reads it. Nothing may wait on a thread (a sync tool run in a
worker thread would let the clock jump past it): tools in a simulation are async.

Deterministic: trio runs the tasks woken at one instant in a random order (to shake out ordering
assumptions), so two stages released by one predecessor reached the engine in either order and
identical simulations differed (LPM's mean JCT 20.4 / 21.1 s on the same tasks). A simulation
runs with trio's own deterministic scheduling (the hook pytest-trio uses under Hypothesis: the
batch sorted by task creation, then shuffled by a seeded generator), so the same workload and
`seed` give the same run, and paired policy comparisons differ only by the policies."""

from __future__ import annotations

import anyio


def run(main, *args, seed: int = 0):
    """anyio.run(main, *args) on trio with a virtual clock and seeded scheduling; returns main's
    result."""
    from trio._core import _run as trio_run
    from trio.testing import MockClock

    was, rng = trio_run._ALLOW_DETERMINISTIC_SCHEDULING, trio_run._r
    state = rng.getstate()
    trio_run._ALLOW_DETERMINISTIC_SCHEDULING = True
    rng.seed(seed)
    try:
        return anyio.run(main, *args, backend="trio", backend_options={"clock": MockClock(autojump_threshold=0)})
    finally:
        trio_run._ALLOW_DETERMINISTIC_SCHEDULING = was
        rng.setstate(state)
