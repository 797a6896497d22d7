"""The interface of the scheduling policies (scheduling/policies.py, scheduling/topas.py): the view a policy
decides on at each scheduling point, and its decision. Policies are pure functions of the view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Ready:
    """A ready (waiting) request as a policy sees it."""

    req: object  # the engine's Request (policies return these in Decision.order)
    stage: str | None  # the agent that makes it
    task: str | None
    arrival: float  # the core clock's now() at submission
    task_arrival: float  # ... of its task's first request
    resident: int  # prompt tokens whose KV is resident now (radix match or its session)
    cells: int  # KV cells it adds if admitted now: uncomputed prompt + max new tokens
    remaining: float  # expected seconds on its task's longest remaining path (its stage included)
    cost: float  # expected seconds of this request's own service
    successors: tuple[str, ...] = ()  # stages its task may go to after this stage
    work: int = 0  # tokens it still has to compute past what is resident and its agent's prefix
    new_tokens: int = 0  # ... of which it may still generate (decode steps)


@dataclass
class SchedulingView:
    ready: list[Ready]  # in arrival order
    running: list[Ready]  # admitted requests, same fields (resident: what they hold)
    prefix_len: dict[str, int]  # agent -> tokens of its static prefix (learned)
    resident: dict[str, int]  # agent -> tokens of its static prefix resident now
    budget: int  # KV cells (tokens) prefixes and admitted requests may use in all
    reload_s_per_token: float  # cost of recomputing one prefix token
    now: float
    upcoming: dict[str, float] = field(default_factory=dict)  # agent -> expected requests soon from
    # tasks between requests (a tool running, or the next stage about to start): scheduling/tasks.py
    decode_step_s: float = 0.0  # a decode-only step's seconds, learned (0: not known yet) ...
    decode_per_seq_s: float = 0.0  # ... of which each sequence's share: step(n) = decode_step_s + per_seq * (n - 1)
    explain: bool = False  # fill Decision.terms (the decision trace is on: scheduling/trace.py)

    def prefix(self, stage: str | None) -> int:
        """Tokens of `stage`'s static prefix (0: none learned, or a request of no stage)."""
        return 0 if stage is None else self.prefix_len.get(stage, 0)


@dataclass(frozen=True)
class Decision:
    order: list  # ready requests to admit, in this order
    keep: frozenset[str] | None = None  # agents whose prefixes stay resident (None: the eviction policy decides)
    terms: tuple = ()  # with view.explain: the score terms of each candidate (dicts; the trace's)


class SchedulingPolicy(Protocol):
    name: str

    def decide(self, view: SchedulingView) -> Decision: ...
