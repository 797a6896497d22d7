"""TOPAS (seed 004): choose, at each scheduling point, which agents' prefixes stay resident and
which ready requests are admitted, jointly, by a job-completion-time utility.

A candidate post-decision state is a set R' of agents whose prefixes are resident, plus the
ready requests of those agents admitted under the joint KV budget (the seed's eq. 2):

    sum(prefix_len[a] for a in R') + sum(cells of running and admitted requests) <= budget

R' always holds the agents of running requests (TOPAS here never preempts: a running request's
work is never thrown away for a policy's sake). For each R' the admitted set is filled greedily
by value. The state's utility, in units of "fraction of a task's remaining path":

- **progress**: an admitted request r of task J at stage s shortens J's longest remaining path
  (engine/tasks.py, from the DAG and each stage's learned service time) by cost(s); its value is
  `aging(J) * cost(s) / remaining(J)` -- the share of J's remaining path it completes (a task
  near its end gains most, as in SRPT), times task aging `1 + age(J) / aging_s`, so a task kept
  waiting gains priority without bound and cannot starve.
- **prefix moves**: an agent in R' whose prefix is not resident costs its missing tokens' reload
  time, converted to value units by the mean weight (1 / remaining, no aging) of the ready requests: a
  switch pays off only when the work it enables is worth more than the work its reload delays.
- **evictions**: when the state does not fit beside the other resident prefixes, resident
  agents left out of R' that still have ready work are charged their reload.
- **one-step lookahead**: a resident agent that running or admitted requests' tasks go to next
  (their stage's successors in the DAG) is worth keeping: it saves that reload later.
An idle engine always admits (the best state with at least one request), so work is never held
back forever. Search: every subset of the candidate agents when there are at most
`exhaustive_agents` of them, else a bounded greedy (add the best agent while utility rises).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from agentrt.engine.policies import Decision, Ready, SchedulingView

EPS = 1e-3  # seconds: floor of a remaining path
LOOKAHEAD = 0.5  # weight of a successor's saved reload


@dataclass
class _State:
    agents: frozenset
    admitted: list
    utility: float


class Topas:
    name = "topas"

    def __init__(self, aging_s: float = 10.0, exhaustive_agents: int = 6):
        self.aging_s, self.exhaustive = aging_s, exhaustive_agents

    def decide(self, view: SchedulingView) -> Decision:
        ctx = _Context(view, self.aging_s)
        forced = frozenset(r.stage for r in view.running)
        nexts = {a for r in (*view.running, *view.ready) for a in r.successors if view.resident.get(a, 0) > 0}
        cands = sorted(({r.stage for r in view.ready} | nexts) - forced, key=str)
        if len(cands) <= self.exhaustive:
            subsets = (frozenset(c) for k in range(len(cands) + 1) for c in itertools.combinations(cands, k))
            states = [ctx.evaluate(forced | s) for s in subsets]
        else:
            states = self._greedy(ctx, forced, cands)
        best = max(states, key=lambda st: st.utility)
        if not view.running and not best.admitted:  # an idle engine always admits
            busy = [st for st in states if st.admitted]
            best = max(busy, key=lambda st: st.utility) if busy else best
        if not best.admitted and not view.running:
            best = ctx.evaluate(frozenset({view.ready[0].stage}), force=True)
        order = sorted(best.admitted, key=ctx.value, reverse=True)
        return Decision([r.req for r in order], frozenset(a for a in best.agents if a is not None))

    def _greedy(self, ctx: "_Context", forced: frozenset, cands: list) -> list[_State]:
        state, states, left = ctx.evaluate(forced), [], list(cands)
        states.append(state)
        while left:
            trials = [ctx.evaluate(state.agents | {a}) for a in left]
            states.extend(trials)
            nxt = max(trials, key=lambda st: st.utility)
            if nxt.utility <= state.utility:
                break
            left = [a for a in left if a not in nxt.agents]
            state = nxt
        return states


class _Context:
    """One decision's precomputed figures."""

    def __init__(self, view: SchedulingView, aging_s: float):
        self.view, self.aging_s = view, aging_s
        self.ready = sorted(view.ready, key=self.value, reverse=True)
        # (without aging: the price of a move must not grow with the age of who waits for it,
        # or an old task's growing priority would never outweigh it)
        weights = [1.0 / max(r.remaining, EPS) for r in view.ready] or [1.0]
        self.wbar = sum(weights) / len(weights)
        self.dynamic = sum(r.cells for r in view.running)
        self.has_work = {r.stage for r in view.ready}

    def weight(self, r: Ready) -> float:
        age = max(0.0, self.view.now - r.task_arrival)
        return (1.0 + age / self.aging_s) / max(r.remaining, EPS)

    def value(self, r: Ready) -> float:
        return self.weight(r) * r.cost

    def reload(self, agent) -> float:
        """Value lost to reloading `agent`'s missing prefix tokens."""
        v = self.view
        missing = max(0, v.prefix_len.get(agent, 0) - v.resident.get(agent, 0))
        return missing * v.reload_s_per_token * self.wbar

    def evaluate(self, agents: frozenset, force: bool = False) -> _State:
        v = self.view
        prefixes = sum(v.prefix_len.get(a, 0) for a in agents)
        room = v.budget - prefixes - self.dynamic
        admitted = []
        for r in self.ready:
            if r.stage in agents and (r.cells <= room or (force and not admitted)):
                admitted.append(r)
                room -= r.cells
        utility = sum(self.value(r) for r in admitted)
        utility -= sum(self.reload(a) for a in agents)
        others = sum(n for a, n in v.resident.items() if a not in agents)
        if prefixes + self.dynamic + sum(r.cells for r in admitted) + others > v.budget:
            utility -= sum(self.reload_full(a) for a in v.resident if a not in agents and a in self.has_work)
        utility += LOOKAHEAD * self._lookahead(agents, admitted)
        return _State(agents, admitted, utility)

    def reload_full(self, agent) -> float:
        v = self.view
        return v.resident.get(agent, 0) * v.reload_s_per_token * self.wbar

    def _lookahead(self, agents: frozenset, admitted: list) -> float:
        v, gain = self.view, 0.0
        for a in agents:
            if v.resident.get(a, 0) <= 0:
                continue
            p = sum(1.0 / len(r.successors) for r in (*v.running, *admitted) if a in r.successors)
            gain += min(1.0, p) * self.reload_full(a)
        return gain
