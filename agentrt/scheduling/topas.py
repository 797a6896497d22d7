"""TOPAS (seed 004): choose, at each scheduling point, which agents' prefixes stay resident and
which ready requests are admitted, jointly, by a job-completion-time utility.

A candidate post-decision state is a set R' of agents whose prefixes are resident, plus the
ready requests of those agents admitted under the joint KV budget (the seed's eq. 2):

    sum(prefix_len[a] for a in R') + sum(cells of running and admitted requests) <= budget

R' always holds the agents of running requests (TOPAS here never preempts: a running request's
work is never thrown away for a policy's sake); the search chooses which other agents join it.
For each R' the admitted set A is filled greedily in locality order: the longest resident match
first, as LPM admits (weight breaks ties). Filling by weight instead mixed stages in one batch
and cost TOPAS its cache hits: on the simulated H100 at 4x load it lost 35-91% mean JCT to LPM,
filled by locality it is within 9% of LPM. The state's score is a
weighted-shortest-processing-time index (Smith's rule with setup times), in seconds:

    score = sum(w(r) * cost(r) for r in A) / (moves + work(A) + evictions)

- **progress** (numerator): an admitted request r of task J at stage s shortens J's longest
  remaining path (scheduling/tasks.py: the DAG and each stage's learned service time) by cost(s);
  w(r) = aging(J) / remaining(J), so what counts is the *share* of J's remaining path done (a
  task near its end gains most, as in SRPT), times task aging `1 + age(J) / aging_s`: a task
  kept waiting gains priority without bound and cannot starve.
- **prefix moves**: the reload time of the missing tokens of every agent in R' not resident,
  charged as if the move served at least a full batch: a move whose k admitted requests are
  fewer than the n that fit beside its prefix (the budget less the prefix, over the ready
  requests' mean cells) is charged n / k times its reload. A move is a setup the visit amortizes;
  charged once, a 2,000-token prefix was moved in for one request of a task near its end (its
  weight is high), the requests that piled up behind it then paid a second move: on the seed's
  diamond TOPAS evicted 19% more prefix pages than LPM (simulated, 5 task sets) and lost to it
  in 4 of 5 paired real-engine repetitions, by up to 14% mean JCT.
- **work(A)**: the engine time A takes: the prompt tokens it still has to compute (past what is
  resident and past its agent's prefix -- a tool call's follow-up finds its first call cached)
  at the learned prefill rate, plus the longest generation's decode steps at the learned decode
  step line, base + per sequence (kv/tier.py::CostModel: a GPU's decoders share each step, a
  CPU's each pay their row); before a decode step has been seen, every token at the prefill rate.
- **evictions and one-step lookahead**: when A does not fit beside the other resident prefixes,
  the ones left out go (least needed first); each that still has ready work, or that work
  expected next needs -- a running request's task going on to its stage's successors in the
  DAG, or a task between two requests (running a tool: its stage again, or its successors;
  scheduling/tasks.py::upcoming) -- is charged its reload, by that probability. `keep` names R' and
  the resident prefixes likely needed next, so the memory manager evicts other prefixes first.
The best state runs first. Work is not held back for nothing: after the choice, ready requests of
other *resident* agents join the batch while they fit without evicting anything (their prefix is
already paid for), and an idle engine always admits. Search: every subset of the candidate
agents when there are at most `exhaustive_agents` of them, else a bounded greedy (add the agent
that raises the score most, while it rises).

The "missing half" of issue 60, measured as options (bench/topas_ablation.py) and off by default
because neither beat the above on the simulated H100 (bench/results/topas_ablation.json):
- `admission="age"`: inside the chosen agent set, requests whose agent's prefix is resident are
  admitted oldest task first (not longest resident match first);
- `switch_full=f > 0`: leave the resident stage -- admit nothing more of the running agents, so
  they drain -- when the oldest waiting task's stage is not running and has at least f full
  batches ready (the requests that fit beside its prefix, over their mean cells).
Both buy task order with throughput: on a GPU a decode step costs about the same for one row as
for five, and a drain under-fills every step until the running requests end.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from agentrt.errors import ConfigError
from agentrt.scheduling.policy_base import Decision, Ready, SchedulingView

EPS = 1e-3  # seconds: floor of a remaining path and of a state's time
RESIDENT = 0.5  # an agent counts as resident when this share of its prefix is
KEEP_P = 0.25  # a resident prefix expected to be needed with this probability soon is kept
ADMISSIONS = ("locality", "age")  # fill order inside a chosen agent set (the class docstring)


@dataclass
class _State:
    agents: frozenset
    admitted: list
    score: float
    terms: tuple = ()  # (progress, moves, work, evictions): the score is progress / (moves + work + evictions)

    def explain(self, chosen: bool) -> dict:
        gain, moves, work, evictions = self.terms or (0.0, 0.0, 0.0, 0.0)
        return {"agents": sorted(a for a in self.agents if a is not None), "admitted": len(self.admitted),
                "progress": gain, "moves_s": moves, "work_s": work, "evictions_s": evictions,
                "score": self.score, "chosen": chosen}


class Topas:
    name = "topas"

    def __init__(self, aging_s: float = 10.0, exhaustive_agents: int = 6, admission: str = "locality",
                 switch_full: float = 0.0):
        if admission not in ADMISSIONS:
            raise ConfigError(f"Topas admission must be one of {ADMISSIONS}, got {admission!r}")
        self.aging_s, self.exhaustive = aging_s, exhaustive_agents
        self.admission, self.switch_full = admission, switch_full

    def decide(self, view: SchedulingView) -> Decision:
        ctx = _Context(view, self.aging_s, self.admission)
        if self.switch_full > 0:
            switch = ctx.switch(self.switch_full)
            if switch is not None:
                return switch
        forced = frozenset(r.stage for r in view.running)
        cands = sorted(({r.stage for r in view.ready} | ctx.next_resident) - forced, key=str)
        if len(cands) <= self.exhaustive:
            subsets = (frozenset(c) for k in range(len(cands) + 1) for c in itertools.combinations(cands, k))
            states = [ctx.evaluate(forced | s) for s in subsets]
        else:
            states = self._greedy(ctx, forced, cands)
        busy = [st for st in states if st.admitted]
        best = max(busy or states, key=lambda st: st.score)
        if not best.admitted and not view.running and view.ready:  # an idle engine always admits
            best = ctx.evaluate(frozenset({ctx.ready[0].stage}), force=True)
        admitted, agents = ctx.free_riders(best)
        keep = agents | ctx.next_resident
        terms: tuple[dict, ...] = ()
        if view.explain:  # (every state weighed; the idle engine's forced one too)
            weighed = states if any(st is best for st in states) else [*states, best]
            terms = tuple(st.explain(st is best) for st in weighed)
        return Decision([r.req for r in admitted], frozenset(a for a in keep if a is not None), terms)

    def _greedy(self, ctx: "_Context", forced: frozenset, cands: list) -> list[_State]:
        state, left = ctx.evaluate(forced), list(cands)
        states = [state]
        while left:
            trials = [ctx.evaluate(state.agents | {a}) for a in left]
            states.extend(trials)
            nxt = max(trials, key=lambda st: st.score)
            if nxt.score <= state.score and state.admitted:
                break
            left = [a for a in left if a not in nxt.agents]
            state = nxt
        return states


class _Context:
    """One decision's precomputed figures."""

    def __init__(self, view: SchedulingView, aging_s: float, admission: str = "locality"):
        self.view, self.aging_s = view, aging_s
        self.ready = sorted(view.ready, key=self.weight, reverse=True)
        # admission order inside a chosen agent set: longest resident match first (LPM's
        # locality: requests on one resident prefix batch together), weight breaking ties; with
        # "age", the requests on a resident prefix oldest task first
        if admission == "age":
            self.by_locality = sorted(view.ready, key=lambda r: (-min(r.resident, view.prefix(r.stage)),
                                                                 r.task_arrival))
        else:
            self.by_locality = sorted(view.ready, key=lambda r: (-r.resident, -self.weight(r)))
        self.dynamic = sum(r.cells for r in view.running)
        self.mean_cells = max(1.0, sum(r.cells for r in view.ready) / max(1, len(view.ready)))
        self.resident = {a for a, n in view.resident.items() if n > 0 and n >= RESIDENT * view.prefix(a)}
        self.has_work = {r.stage for r in view.ready} | {r.stage for r in view.running}
        nxt = dict(view.upcoming)  # work expected soon: tasks between requests, and what the
        for r in view.running:  # running requests' tasks do next (one-step lookahead)
            for a in r.successors:
                nxt[a] = nxt.get(a, 0.0) + 1.0 / len(r.successors)
        self.successor_p = {a: min(1.0, p) for a, p in nxt.items()}
        self.next_resident = frozenset(a for a, p in nxt.items() if a in self.resident and p >= KEEP_P)

    def switch(self, full_batches: float) -> Decision | None:
        """Leave the running stages for the oldest waiting task's stage when it is not running
        and has `full_batches` full batches ready: its requests oldest task first, nothing more
        for the running stages (they drain). None: stay."""
        v = self.view
        if not v.ready or not v.running:
            return None
        oldest = min(v.ready, key=lambda r: r.task_arrival)
        if oldest.stage in {r.stage for r in v.running}:
            return None
        batch = sorted((r for r in v.ready if r.stage == oldest.stage), key=lambda r: r.task_arrival)
        mean = sum(max(1, r.cells) for r in batch) / len(batch)
        if len(batch) < full_batches * max(1.0, (v.budget - v.prefix(oldest.stage)) / mean):
            return None
        terms = ({"switch_to": oldest.stage, "ready": len(batch)},) if v.explain else ()
        keep = frozenset() if oldest.stage is None else frozenset({oldest.stage})
        return Decision([r.req for r in batch], keep, terms)

    def weight(self, r: Ready) -> float:
        age = max(0.0, self.view.now - r.task_arrival)
        return (1.0 + age / self.aging_s) / max(r.remaining, EPS)

    def reload(self, agent, full: bool = False) -> float:
        """Seconds to recompute `agent`'s missing prefix tokens (all of them with `full`)."""
        v = self.view
        n = v.prefix(agent)
        missing = n if full else max(0, n - v.resident.get(agent, 0))
        return missing * v.reload_s_per_token

    def move(self, agent, admitted: list) -> float:
        """Seconds charged for bringing `agent`'s prefix in for `admitted`: its reload, times
        full / k where fewer than the `full` batch that fits beside the prefix are its own."""
        v = self.view
        full = (v.budget - v.prefix(agent)) / self.mean_cells
        k = sum(1 for r in admitted if r.stage == agent)
        return self.reload(agent) * max(1.0, full / max(k, 1))

    def evaluate(self, agents: frozenset, force: bool = False) -> _State:
        v = self.view
        prefixes = sum(v.prefix(a) for a in agents)
        room = v.budget - prefixes - self.dynamic
        admitted: list[Ready] = []
        for r in self.by_locality:
            if r.stage in agents and (r.cells <= room or (force and not admitted)):
                admitted.append(r)
                room -= r.cells
        if not admitted:
            return _State(agents, admitted, 0.0)
        work = self.batch_s(admitted)
        moves = sum(self.move(a, admitted) for a in agents if a not in self.resident)
        evictions = self._evictions(agents, room)
        gain = sum(self.weight(r) * r.cost for r in admitted)
        return _State(agents, admitted, gain / max(moves + work + evictions, EPS), (gain, moves, work, evictions))

    def batch_s(self, admitted: list) -> float:
        """Engine seconds to serve `admitted` together: their prompt tokens at the prefill rate,
        plus, once a decode step's time is known, the longest generation's steps at the
        calibrated line (base + per sequence, for the batch beside the running requests:
        shared on a GPU, each row paid on a CPU); until then every token at the prefill rate."""
        v = self.view
        if v.decode_step_s <= 0.0:
            return sum(r.work for r in admitted) * v.reload_s_per_token
        prefill = sum(r.work - r.new_tokens for r in admitted) * v.reload_s_per_token
        step = v.decode_step_s + v.decode_per_seq_s * (len(admitted) + len(v.running) - 1)
        return prefill + max(r.new_tokens for r in admitted) * step

    def _evictions(self, agents: frozenset, room: int) -> float:
        """Reload time owed to resident prefixes outside `agents` that must go to make `room`
        (negative: an overflow), least needed first."""
        v = self.view
        others = [a for a in self.resident if a not in agents]
        overflow = sum(v.resident[a] for a in others) - room
        cost = 0.0
        for need, a in sorted((self._need(a), a) for a in others):
            if overflow <= 0:
                break
            overflow -= v.resident[a]
            cost += need * self.reload(a, full=True)
        return cost

    def _need(self, agent) -> float:
        return 1.0 if agent in self.has_work else self.successor_p.get(agent, 0.0)

    def free_riders(self, best: _State) -> tuple[list, frozenset]:
        """`best`'s admissions plus ready requests of other resident agents that fit beside the
        prefixes likely needed soon, evicting none of them."""
        v, agents = self.view, set(best.agents)
        used = sum(v.prefix(a) for a in agents) + self.dynamic + sum(r.cells for r in best.admitted)
        # (resident prefixes nothing is expected to need soon may go: the memory manager takes them first)
        used += sum(v.resident[a] for a in self.resident if a not in agents and self._need(a) >= KEEP_P)
        admitted, chosen = list(best.admitted), {id(r) for r in best.admitted}
        for r in self.ready:
            if id(r) in chosen or r.stage not in self.resident or used + r.cells > v.budget:
                continue
            admitted.append(r)
            agents.add(r.stage)
            used += r.cells
        return admitted, frozenset(agents)
