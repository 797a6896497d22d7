"""The engine step's constraint masks: a request's logits row masked by its constraint
(`mask_row`), and the step's masks filled in a worker thread while the model's forward runs
(`MaskPrefetch`).

Fault isolation: a constraint whose fill raises in the worker is left unprepared; mask_row fills
it again on the step thread, where the failure is its request's alone."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor

from agentrt.records.constraint import LogitsConstraint
from agentrt.records.request import Request


def mask_row(r: Request, logits, counters):
    """r's logits row [1, V] masked by its constraint, the time it took counted (stats():
    grammar_mask_us_per_row)."""
    if r.constraint is None:  # (callers pass constrained rows only)
        return logits
    t0 = time.perf_counter()
    row = r.constraint.mask_logits(logits[0]).unsqueeze(0)
    counters.mask_seconds += time.perf_counter() - t0
    counters.masked_rows += 1
    return row


class MaskPrefetch:
    """The constraint masks of a step's logits filled in one worker thread while the model's
    forward runs (`LogitsConstraint.prepare`): each state is final once the previous step's
    tokens were accepted, so mask_row then only applies them."""

    def __init__(self, counters, enabled: bool = True) -> None:
        self.counters, self.enabled = counters, enabled
        self._pool: ThreadPoolExecutor | None = None

    def beside(self, plan, chunks, forward):
        """forward()'s result, the masks of the plan's rows that sample filled in the worker
        meanwhile (done before it returns: the worker is through with the constraints before
        anything else touches them)."""
        if not self.enabled:
            return forward()
        pending = self.start([r for (r, _), c in zip(plan, chunks) if r.constraint is not None and c.want_logits])
        try:
            return forward()
        finally:
            self.wait(pending)

    def start(self, reqs: list[Request]) -> Future | None:
        todo = [r.constraint for r in reqs if r.constraint is not None]
        if not todo:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="agentrt-grammar")
        return self._pool.submit(_prepare_all, todo)

    def wait(self, pending: Future | None) -> None:
        if pending is not None:
            self.counters.mask_prepare_seconds += pending.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _prepare_all(constraints: list[LogitsConstraint]) -> float:
    t0 = time.perf_counter()
    for c in constraints:
        # a fill that raises stays undone: mask_row fills it again on the step thread, where
        # the failure is its request's alone
        with contextlib.suppress(Exception):
            c.prepare()
    return time.perf_counter() - t0
