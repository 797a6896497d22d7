"""The engine's prefetch between steps (kv/hierarchy.py does the copies): which KV to bring back
from the tier, in what order, and when the idle loop should wake for it.

First the **return prefetch** (`EngineConfig.enable_return_prefetch`) -- the cut histories of
sessions whose tools may return now (kv/retention.py::Retention.due_at), soonest first, each
then held for its request (kv/memory.py: HELD); then, in a decode-only step or an idle
loop, the prefixes of the workflow stages the scheduler expects next
(scheduling/tasks.py::upcoming), then the agents the eviction policy's chain predicts. Nothing
is done while the tier holds nothing: the step loop pays no scan of the sessions then."""

from __future__ import annotations

from collections.abc import Callable

from agentrt.engine.clock import Clock
from agentrt.engine.stats import Counters
from agentrt.kv.hierarchy import Hierarchy
from agentrt.kv.retention import Retention
from agentrt.kv.room import KVRoom
from agentrt.records.request import Request
from agentrt.scheduling.admission import projected_cells
from agentrt.scheduling.scheduler import UPCOMING_S
from agentrt.scheduling.tasks import TaskTracker

PAGES_PER_STEP = 8  # tier copies a decode-only step may add (~1 ms of memcpy on a CPU)
PAGES_IDLE = 1024  # ... and an idle engine
RETURN_PAGES_PER_STEP = 64  # return prefetch per step, any step (a session due is about to run: ~5 ms of copies)
HINT_P = 0.25  # a stage expected next with this probability gets its prefix prefetched
LEAD_STEPS = 2  # a return prefetch starts this many (mean) steps before its tools' early return


class Prefetcher:
    """The engine's prefetch, told what it reads: the KV room (its tier), the hierarchy that
    copies, the retention pins (who waits on tools, when due), the task tracker (stages expected
    next), the counters (mean step time), the clock and the running requests (their growth is
    reserved)."""

    def __init__(self, kv: KVRoom, hierarchy: Hierarchy, retention: Retention, tasks: TaskTracker,
                 counters: Counters, clock: Clock, running: Callable[[], list[Request]], *,
                 page_size: int, return_prefetch: bool):
        self.kv, self.hierarchy, self.retention, self.tasks = kv, hierarchy, retention, tasks
        self.counters, self.clock, self.running = counters, clock, running
        self.page_size, self.return_prefetch = page_size, return_prefetch

    def __call__(self, max_pages: int, return_pages: int) -> float | None:
        """Up to `return_pages` of return prefetch, then up to `max_pages` in all of predicted
        prefixes. Returns seconds until the next waiting session is due (None: none waits)."""
        tier = self.kv.tier
        if tier is None or not tier.used:
            return None
        now, retention = self.clock.now(), self.retention
        lead = LEAD_STEPS * self.counters.step_seconds / max(1, self.counters.steps)
        waiting = retention.waiting() if self.return_prefetch else ()
        waits = sorted(((retention.due_at(s, lead), s) for s in waiting), key=lambda x: x[0])
        growth = sum(-(-(r.remaining + 1) // self.page_size) for r in self.running()) if waits else 0
        done = self.hierarchy.prefetch_returning([s for t, s in waits if t <= now], return_pages,
                                                 hold=lambda es: retention.hold(es, now, lead),
                                                 growth=growth) if waits else 0
        if max_pages > done:
            self._predicted(max_pages - done, now)
        later = [t for t, _ in waits if t > now]
        return min(later) - now if later else None

    def _predicted(self, pages: int, now: float) -> None:
        """The prefixes of the stages expected next, then the agents the policy predicts."""
        tasks, ps = self.tasks, self.page_size
        self.hierarchy.prefetch(pages, hints=lambda: {
            a: tasks.prefix_len(a) for a, p in tasks.upcoming(now, UPCOMING_S).items() if p >= HINT_P},
            reserve=lambda: sum(-(-projected_cells(r) // ps) for r in self.running()))  # (their growth)
