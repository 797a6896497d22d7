"""Scheduling policies (next to the eviction policies of kv/eviction.py): at each scheduling
point, given the ready requests, the agents' resident prefixes, the KV budget and the task DAGs
(scheduling/tasks.py), choose which ready requests are admitted, in which order, and which agents'
prefixes stay resident. The engine's scheduler (scheduling/scheduler.py) applies the decision:
it admits in the decided order while each request fits (the first that does not fit ends the
admission: no request overtakes a blocked one), and the memory manager evicts the prefixes of
agents outside `keep` first.

- `fcfs`: arrival order (the engine's behaviour before workflow-aware scheduling).
- `lpm`: longest resident prefix first (SGLang's locality-first policy).
- `srpt`: the task with the least expected remaining work first (progress-first).
- `program_fcfs`: the oldest task first, so a task's later calls are not queued behind newer
  tasks' first calls (Autellix / Continuum program-level ordering).
- `topas`: seed 004, joint prefix residency and admission (scheduling/topas.py).
Ties keep arrival order. Policies are pure functions of the view (scheduling/policy_base.py): no
engine state is touched. `make_scheduling_policy` builds one by name, above every implementation.
"""

from __future__ import annotations

from agentrt.errors import ConfigError
from agentrt.policy_names import SCHEDULING_POLICIES

# (the view's types are importable from here too: the policies and their view in one import)
from agentrt.scheduling.policy_base import Decision, Ready, SchedulingPolicy, SchedulingView  # noqa: F401
from agentrt.scheduling.topas import Topas


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
        return Decision([r.req for r in order], terms=_terms(view, order, "resident"))


class SRPT:
    """The task with the least expected remaining work first (progress-first)."""

    name = "srpt"

    def decide(self, view: SchedulingView) -> Decision:
        order = sorted(view.ready, key=lambda r: r.remaining)
        return Decision([r.req for r in order], terms=_terms(view, order, "remaining"))


class ProgramFCFS:
    """The oldest task first (program-level FCFS)."""

    name = "program_fcfs"

    def decide(self, view: SchedulingView) -> Decision:
        order = sorted(view.ready, key=lambda r: r.task_arrival)
        return Decision([r.req for r in order], terms=_terms(view, order, "task_arrival"))


def _terms(view: SchedulingView, order: list[Ready], key: str) -> tuple:
    """The sort key of each candidate, in the decided order (only while the trace is on)."""
    if not view.explain:
        return ()
    return tuple({"stage": r.stage, "task": r.task, key: getattr(r, key)} for r in order)


def make_scheduling_policy(name: str, **topas_args) -> SchedulingPolicy:
    """A policy by its EngineConfig.scheduling_policy name (one of SCHEDULING_POLICIES); `topas_args`
    configure Topas."""
    if name == Topas.name:
        return Topas(**topas_args)
    for cls in (FCFS, LPM, SRPT, ProgramFCFS):
        if cls.name == name:
            return cls()
    raise ConfigError(f"unknown scheduling policy {name!r}; expected one of {SCHEDULING_POLICIES}")
