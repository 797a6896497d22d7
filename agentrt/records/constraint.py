"""`LogitsConstraint`: every method the engine's step calls on a per-request constraint (a
grammar), each with a documented default. An implementation subclasses it and overrides what it
constrains; the engine calls every method directly (nothing is probed for).

Where the engine calls them (all on the step thread, except `prepare`):
  * `prepare()`: in a worker thread while the model's forward runs (`masks.MaskPrefetch`);
  * `mask_logits(row)`: each sampled row (`masks.mask_row`) and each verified draft position
    (`sampling/speculative.py::verify_constrained`);
  * `advance(token)`: after each sampled or verified token;
  * `is_terminated()`: the stop rule after a step's last token; verification;
  * `accepts_prefix(draft)`: a greedy request's draft cut to what the constraint accepts
    (`scheduling/speculation.py::choose_draft`);
  * `fast_forward(last, room)`: the ids the constraint forces after a token, or at the start
    (`fast_forward.py`; `model/generate.py` feeds them one per step, the reference).

The methods are called by one thread at a time, never concurrently on one constraint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class LogitsConstraint(Protocol):
    """A per-request constraint applied inside the batched step. Subclass it: each method below
    is the default (allow every token, keep no state, force nothing, draft nothing)."""

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] -> the row with forbidden tokens at -inf (in place allowed). Default: every
        token allowed, the row returned as is."""
        return logits

    def advance(self, token: int) -> None:
        """`token` was accepted into the output (sampled, verified or forced). Default: no state."""

    def is_terminated(self) -> bool:
        """The constrained output is complete: the request stops after the step's last token.
        Default: never (stop ids and max_tokens end the request)."""
        return False

    def prepare(self) -> None:
        """Compute the mask of the current state now, for the next `mask_logits` (called in a
        worker thread beside the forward; a raise leaves the work to mask_logits). Default:
        nothing, mask_logits does all its work."""

    def accepts_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` (a speculative draft) the constraint accepts in order from its
        current state, which is left unchanged. Default: 0, so a constraint that cannot check a
        draft is decoded without one."""
        return 0

    def fast_forward(self, last: int | None, room: int) -> tuple[int, list[int]]:
        """The ids forced after `last` (the token just accepted; None at the start), at most
        `room`: (replaced, ids), ids accepted in place of the last `replaced` (0 or 1) tokens
        and after them. Default: (0, []), nothing forced."""
        return 0, []
