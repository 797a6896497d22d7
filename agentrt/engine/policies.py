"""Scheduling policies (next to the eviction policies of cache/base.py): at each scheduling
point, given the ready requests, the agents' resident prefixes, the KV budget and the task DAGs
(engine/tasks.py), choose which ready requests are admitted, in which order, and which agents'
prefixes stay resident. The engine's scheduler (engine/scheduler.py) applies the decision:
it admits in the decided order while each request fits (the first that does not fit ends the
admission: no request overtakes a blocked one), and the memory manager evicts the prefixes of
agents outside `keep` first.

- `fcfs`: arrival order (the engine's behaviour before workflow-aware scheduling).
- `lpm`: longest resident prefix first (SGLang's locality-first policy).
- `srpt`: the task with the least expected remaining work first (progress-first).
- `program_fcfs`: the oldest task first, so a task's later calls are not queued behind newer
  tasks' first calls (Autellix / Continuum program-level ordering).
- `topas`: seed 004, joint prefix residency and admission (engine/topas.py).
Ties keep arrival order. Policies are pure functions of the view: no engine state is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

SCHEDULING_POLICIES = ("fcfs", "lpm", "srpt", "program_fcfs", "topas")


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
    # tasks between requests (a tool running, or the next stage about to start): engine/tasks.py


@dataclass(frozen=True)
class Decision:
    order: list  # ready requests to admit, in this order
    keep: frozenset[str] | None = None  # agents whose prefixes stay resident (None: the eviction policy decides)


class SchedulingPolicy(Protocol):
    name: str

    def decide(self, view: SchedulingView) -> Decision: ...


class FCFS:
    """Arrival order; no opinion on residency."""

    name = "fcfs"

    def decide(self, view: SchedulingView) -> Decision:
        return Decision([r.req for r in view.ready])


class LPM:
    """Longest resident prefix first (locality-first)."""

    name = "lpm"

    def decide(self, view: SchedulingView) -> Decision:
        order = sorted(view.ready, key=lambda r: -r.resident)  # (sorted is stable: arrival breaks ties)
        return Decision([r.req for r in order])


class SRPT:
    """The task with the least expected remaining work first (progress-first)."""

    name = "srpt"

    def decide(self, view: SchedulingView) -> Decision:
        return Decision([r.req for r in sorted(view.ready, key=lambda r: r.remaining)])


class ProgramFCFS:
    """The oldest task first (program-level FCFS)."""

    name = "program_fcfs"

    def decide(self, view: SchedulingView) -> Decision:
        return Decision([r.req for r in sorted(view.ready, key=lambda r: r.task_arrival)])


def make_scheduling_policy(name: str, **topas_args) -> SchedulingPolicy:
    """A policy by its EngineConfig.scheduling_policy name (validated there)."""
    if name == "topas":
        from agentrt.engine.topas import Topas

        return Topas(**topas_args)
    return {"fcfs": FCFS, "lpm": LPM, "srpt": SRPT, "program_fcfs": ProgramFCFS}[name]()
