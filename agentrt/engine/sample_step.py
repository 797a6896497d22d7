"""One step's sampling and stop rules, as functions of the requests and their logits rows.
Fault isolation: a row whose sampling raises (bad params, NaN probabilities) fails its request
through `fail` and leaves the other rows' draws unchanged."""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor

from agentrt.engine.request import Request
from agentrt.sampling import sample_batch


class MaskPrefetch:
    """The grammar masks of a step's logits filled in one worker thread while the model's forward
    runs: each state is final once the previous step's tokens were accepted, so mask_row then
    only applies them (`prepare()`, toolcall/grammar.py). A constraint whose fill raises is left
    unprepared: mask_row fills it again and its request alone fails."""

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
        todo = [r.constraint for r in reqs if hasattr(r.constraint, "prepare")]
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


def _prepare_all(constraints) -> float:
    t0 = time.perf_counter()
    for c in constraints:
        # a fill that raises stays undone: mask_row fills it again on the step thread, where
        # the failure is its request's alone
        with contextlib.suppress(Exception):
            c.prepare()
    return time.perf_counter() - t0


def mask_row(r: Request, logits, counters):
    """r's logits row [1, V] masked by its grammar, the time it took counted (stats():
    grammar_mask_us_per_row)."""
    t0 = time.perf_counter()
    row = r.constraint.mask_logits(logits[0]).unsqueeze(0)
    counters.mask_seconds += time.perf_counter() - t0
    counters.masked_rows += 1
    return row


def sample_rows(reqs: list[Request], logits, argmax, fail) -> list[int | None]:
    """Rows already masked by their constraints -> one token per request (None: it failed).
    Greedy rows share one argmax; a sampled row is drawn alone (as sample_batch does)."""
    toks: list[int | None] = [None] * len(reqs)
    greedy = [i for i, r in enumerate(reqs) if is_greedy(r)]
    if greedy:
        try:
            rows = logits if len(greedy) == len(reqs) else logits[greedy]  # (all greedy: no copy)
            ids = sample_batch(rows, [reqs[i].params for i in greedy], [None] * len(greedy), argmax)
        except Exception:  # find the failing row: argmax is per row, the others are unchanged
            ids = [_sample_one(reqs[i], logits[i], argmax, fail) for i in greedy]
        for i, t in zip(greedy, ids):
            toks[i] = t
    chosen = set(greedy)
    for i, r in enumerate(reqs):
        if i not in chosen:
            toks[i] = _sample_one(r, logits[i], argmax, fail)
    return toks


def _sample_one(r: Request, row, argmax, fail) -> int | None:
    try:
        return sample_batch(row[None], [r.params], [r.generator], argmax)[0]
    except Exception as e:
        fail(r, e)
        return None


def is_greedy(r: Request) -> bool:
    try:
        return bool(r.params.greedy)
    except Exception:
        return False  # sampled alone, where its failure fails it only


def finish_reason(r: Request, t: int, last: bool, context: int) -> str | None:
    """Why r ends after token t (None: it goes on). The grammar state is that after the step's
    last token, so it is consulted for that token only."""
    done = last and r.constraint is not None and r.constraint.is_terminated()
    if t in r.stop_ids or done:
        return "stop"
    if len(r.output) >= r.params.max_tokens:
        return "length"
    if r.target_len >= context:
        return "length"
    return None
