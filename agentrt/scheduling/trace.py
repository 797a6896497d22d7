"""The per-decision trace (`EngineConfig.decision_trace`: the last N scheduling decisions kept;
0, the default, keeps none and costs nothing).

Each record is one scheduling decision as the policy made it and as the engine applied it:
the candidates (every ready request with the figures the policy saw: its stage, task, resident
match, cells, remaining path, work), the running requests, the resident prefixes, the policy's
order and kept agents, its score terms per candidate state (TOPAS: progress, prefix moves, batch
work, evictions and the score; the simple policies: the key they sort by), which of the order
were admitted, and what left the pool since the decision before (the leaves taken to make room:
agent, start, tokens, pages). `bench/workflow_trace.py` compares two policies' traces on the same
tasks and prints the first decision where they part.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field


def request_key(r) -> str:
    """A request's name stable across runs of the same tasks (rids are not): task/stage@its
    prompt's length (a stage's later calls extend its earlier prompts)."""
    return f"{r.task}/{r.tag}@{len(r.prompt)}" if r.task is not None else f"{r.tag}@{len(r.prompt)}"


@dataclass
class DecisionRecord:
    index: int
    now: float
    policy: str
    ready: list[dict]  # the candidates, arrival order
    running: list[dict]
    resident: dict[str, int]  # agent -> tokens of its static prefix resident
    prefix_len: dict[str, int]
    order: list[str]  # request keys, in the decided order
    keep: list[str] | None
    terms: list[dict]  # the policy's score terms per candidate state
    evicted: list[dict] = field(default_factory=list)  # leaves taken since the decision before
    admitted: list[str] = field(default_factory=list)  # of `order`, what this admission pass took


class DecisionTrace:
    """The last `size` decisions (scheduling/scheduler.py records them; kv/memory.py reports
    what it evicts)."""

    def __init__(self, size: int):
        self.records: deque[DecisionRecord] = deque(maxlen=size)
        self._evicted: list[dict] = []
        self._count = 0

    def evicted(self, leaf) -> None:
        self._evicted.append({"agent": leaf.tag, "start": leaf.start, "tokens": len(leaf.key),
                              "pages": len(leaf.pages)})

    def record(self, view, decision, policy: str) -> DecisionRecord:
        rec = DecisionRecord(
            self._count, view.now, policy, [_ready(x) for x in view.ready], [_ready(x) for x in view.running],
            dict(view.resident), dict(view.prefix_len), [request_key(r) for r in decision.order],
            sorted(decision.keep) if decision.keep is not None else None, list(decision.terms),
            self._evicted)
        self._evicted, self._count = [], self._count + 1
        self.records.append(rec)
        return rec

    def admitted(self, rec: DecisionRecord | None, r) -> None:
        if rec is not None:
            rec.admitted.append(request_key(r))

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.records]


def _ready(x) -> dict:
    return {"key": request_key(x.req), "stage": x.stage, "task": x.task, "resident": x.resident,
            "cells": x.cells, "remaining_s": x.remaining, "cost_s": x.cost, "work": x.work,
            "arrival": x.arrival, "task_arrival": x.task_arrival}
