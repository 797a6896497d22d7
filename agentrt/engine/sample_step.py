"""One step's sampling and stop rules, as functions of the requests and their logits rows (each
constrained row already masked: constrain/step_masks.py).
Fault isolation: a row whose sampling raises (bad params, NaN probabilities) fails its request
through `fail` and leaves the other rows' draws unchanged."""

from __future__ import annotations

from agentrt.records.request import Request
from agentrt.sampling import sample_batch


def sample_rows(reqs: list[Request], logits, argmax, fail) -> list[int | None]:
    """Rows already masked by their constraints -> one token per request (None: it failed).
    Greedy rows share one argmax; a sampled row is drawn alone (as sample_batch does)."""
    toks: list[int | None] = [None] * len(reqs)
    greedy = [i for i, r in enumerate(reqs) if is_greedy(r)]
    if greedy:
        try:
            rows = logits if len(greedy) == len(reqs) else logits[greedy]  # (all greedy: no copy)
            ids: list[int | None] = list(sample_batch(rows, [reqs[i].params for i in greedy], [None] * len(greedy),
                                                      argmax))
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
