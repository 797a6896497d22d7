"""A discrete-event simulation of agents on R engine replicas, driven by a measured step-cost model.

Agents run closed loops: a model call (the prompt is the group's shared prefix plus the agent's
history), then a tool of the agent's type (a fixed latency per type, +-20% jitter), then the
next call, for `turns` turns. Each replica runs continuous batching step by step: a step decodes
one token for every running request and prefills at most `chunk` prompt tokens; its time is the
step model's `decode_base + decode_per_seq * batch + prefill_per_token * tokens`; a call's latency
also has a fixed `call_overhead` spent off the replica (driver, RPC, parsing: measured). KV per replica
is `kv_tokens`: the requests running hold their tokens; what is left caches finished histories
(a radix-like tree: a group prefix node, and one suffix node per agent under it; a prefix node
is evicted only once it has no suffix node).

Placement (`POLICIES`):
  * round_robin, least_loaded (fewest outstanding requests), prefix_affine (the replica holding
    the longest cached prefix of the prompt unless it is imbalanced: more than 32 outstanding
    requests over the least loaded and 1.5x it, as sglang/vllm routers' cache_aware): every
    call is routed on its own, and a replica's cache evicts least recently used first;
  * session_affine: an agent lives on one replica (placed at its first call on the replica with
    the fewest agents, then the fewest outstanding requests, as ClusterRuntime does); its
    cache evicts the idle agent whose next call is expected latest (its tool's latency known,
    as agentrt's tool-aware retention learns it); a call arriving at a replica with more than
    `migrate_gap` requests over the least loaded one moves its session there first (the
    measured transfer time: fixed + per token), when the wait it saves beats the transfer.

Outputs per run: per-turn latency mean/p50/p99 (request arrival -> last token), the same past each
agent's first call (`steady_*`: the first calls of all agents land in a burst at the start), KV hit
rate (prompt tokens served from cache / prompt tokens), load imbalance (max / mean replica busy time).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepModel:
    prefill_per_token: float  # s per prompt token computed
    decode_base: float  # s per decode step, fixed part
    decode_per_seq: float  # s per decode step, per running sequence
    transfer_per_token: float  # s per token to move a session's KV between replicas (snapshot -> restore)
    transfer_fixed: float = 0.0  # s per move, whatever its size
    call_overhead: float = 0.0  # s a call spends outside replica steps (driver, RPC, parsing): latency only

    def step(self, batch: int, prefill: int) -> float:
        return (self.decode_base + self.decode_per_seq * batch if batch else 0.0) + self.prefill_per_token * prefill


@dataclass(frozen=True)
class Workload:
    agents: int
    replicas: int
    turns: int = 4
    groups: int = 8  # agent types: each shares instructions + tools (the prefix) and a tool latency
    prefix_tokens: int = 600
    turn_tokens: int = 160  # the user / tool-result tokens a turn adds before its call
    output_tokens: int = 24
    tool_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0)  # per group
    kv_tokens: int = 32768  # per replica
    chunk: int = 512
    migrate_gap: int = 4
    seed: int = 0


@dataclass
class _Req:
    agent: int
    arrival: float
    prompt: int
    hit: int
    prefill_left: int
    decode_left: int
    tokens: int = 0  # KV held


@dataclass
class _Replica:
    index: int
    queue: list = field(default_factory=list)
    running: list = field(default_factory=list)
    suffix: OrderedDict = field(default_factory=OrderedDict)  # agent -> cached suffix tokens (LRU order)
    prefix: dict = field(default_factory=dict)  # group -> children count (the prefix node is cached)
    busy: float = 0.0
    stepping: bool = False

    def outstanding(self) -> int:
        return len(self.queue) + len(self.running)


class Sim:
    def __init__(self, policy: str, w: Workload, model: StepModel) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.policy, self.w, self.m = policy, w, model
        self.rng = random.Random(w.seed)
        self.reps = [_Replica(i) for i in range(w.replicas)]
        self.history = [0] * w.agents  # tokens after the prefix
        self.group = [a % w.groups for a in range(w.agents)]
        self.home: dict[int, int] = {}
        self.homed = [0] * w.replicas  # agents placed per replica (session_affine)
        self.next_at = [0.0] * w.agents  # expected next call (session_affine eviction)
        self.turn = [0] * w.agents
        self.events: list = []
        self.latencies: list[float] = []
        self.steady: list[float] = []
        self.prompt_tokens = self.cached_tokens = 0
        self.migrations = 0
        self._rr = 0
        self._seq = itertools.count()

    # ---- driver ----------------------------------------------------------------------------
    def run(self) -> dict:
        for a in range(self.w.agents):  # staggered starts over the first tool interval
            self._push(self.rng.uniform(0, self.w.tool_s[self.group[a]]), "call", a)
        while self.events:
            t, _, kind, x = heapq.heappop(self.events)
            if kind == "call":
                self._call(t, x)
            else:
                self._step_end(t, self.reps[x])
        busy = [r.busy for r in self.reps]
        lat, steady = sorted(self.latencies), sorted(self.steady)
        return {"steady_turn_s_mean": sum(steady) / max(1, len(steady)), "steady_turn_s_p50": _q(steady, 0.5),
                "steady_turn_s_p99": _q(steady, 0.99),"policy": self.policy, "agents": self.w.agents, "replicas": self.w.replicas,
                "turn_s_p50": _q(lat, 0.5), "turn_s_p99": _q(lat, 0.99), "turn_s_mean": sum(lat) / len(lat),
                "hit_rate": self.cached_tokens / max(1, self.prompt_tokens),
                "imbalance": max(busy) / (sum(busy) / len(busy)) if sum(busy) else 1.0,
                "migrations": self.migrations, "turns": len(lat)}

    def _push(self, t: float, kind: str, x: int) -> None:
        heapq.heappush(self.events, (t, next(self._seq), kind, x))

    # ---- a call arrives ----------------------------------------------------------------------
    def _call(self, t: float, a: int) -> None:
        self.history[a] += self.w.turn_tokens
        r = self._route(t, a)
        prompt = self.w.prefix_tokens + self.history[a]
        hit = self._hit(r, a)
        self.prompt_tokens += prompt
        self.cached_tokens += hit
        if a in r.suffix:
            r.suffix.pop(a)  # the running request holds it now
            r.prefix[self.group[a]] -= 1
        req = _Req(a, t, prompt, hit, prompt - hit, self.w.output_tokens)
        r.queue.append(req)
        self._kick(t, r)

    def _hit(self, r: _Replica, a: int) -> int:
        g = self.group[a]
        if g not in r.prefix:
            return 0
        return self.w.prefix_tokens + (r.suffix.get(a, 0) if a in r.suffix else 0)

    def _route(self, t: float, a: int) -> _Replica:
        p, reps = self.policy, self.reps
        if p == "round_robin":
            self._rr += 1
            return reps[self._rr % len(reps)]
        least = min(reps, key=lambda r: (r.outstanding(), r.index))
        if p == "least_loaded":
            return least
        if p == "prefix_affine":
            best = max(reps, key=lambda r: (self._hit(r, a), -r.outstanding(), -r.index))
            if self._hit(best, a) == 0:
                return least
            gap = best.outstanding() - least.outstanding()
            return least if gap > 32 and best.outstanding() > 1.5 * least.outstanding() else best
        if a not in self.home:  # placed once, as ClusterRuntime's session_affine: fewest agents, then load
            first = min(reps, key=lambda r: (self.homed[r.index], r.outstanding(), r.index))
            self.home[a] = first.index
            self.homed[first.index] += 1
        home = reps[self.home[a]]
        gap = home.outstanding() - least.outstanding()
        if home is not least and gap > self.w.migrate_gap and self._move_pays(a, home, gap):
            return self._migrate(a, home, least)
        return home

    def _move_pays(self, a: int, home: _Replica, gap: int) -> bool:
        """Move only when the wait it saves (gap requests of decode) beats the transfer."""
        tokens = self.w.prefix_tokens + home.suffix.get(a, 0)
        move = self.m.transfer_fixed + self.m.transfer_per_token * tokens
        wait = gap * self.w.output_tokens * self.m.step(min(gap, 8), 0) / min(gap, 8)
        return move < wait

    def _migrate(self, a: int, src: _Replica, dst: _Replica) -> _Replica:
        tokens = src.suffix.get(a, 0)
        if a not in src.suffix:  # nothing resident: it simply moves
            self._rehome(a, src, dst)
            return dst
        g = self.group[a]
        src.suffix.pop(a)
        src.prefix[g] -= 1
        if g not in dst.prefix:
            dst.prefix[g] = 0
        dst.suffix[a] = tokens
        dst.prefix[g] += 1
        dst.busy += self.m.transfer_fixed + self.m.transfer_per_token * (tokens + self.w.prefix_tokens)
        self._rehome(a, src, dst)
        self.migrations += 1
        return dst

    def _rehome(self, a: int, src: _Replica, dst: _Replica) -> None:
        self.home[a] = dst.index
        self.homed[src.index] -= 1
        self.homed[dst.index] += 1

    # ---- replica steps -----------------------------------------------------------------------
    def _kick(self, t: float, r: _Replica) -> None:
        if not r.stepping:
            self._admit(r)
            if r.running:
                r.stepping = True
                self._push(t + self._step(r), "step", r.index)

    def _admit(self, r: _Replica) -> None:
        while r.queue:
            req = r.queue[0]
            need = req.prompt + req.decode_left - (self.w.prefix_tokens if req.hit else 0)
            if not self._make_room(r, need):
                return
            r.queue.pop(0)
            req.tokens = need
            r.running.append(req)

    def _used(self, r: _Replica) -> int:
        return (sum(q.tokens for q in r.running) + sum(r.suffix.values())
                + self.w.prefix_tokens * len(r.prefix))

    def _make_room(self, r: _Replica, need: int) -> bool:
        while self._used(r) + need > self.w.kv_tokens:
            victim = self._victim(r)
            if victim is None:
                return not r.running  # an idle replica always takes the request
            kind, key = victim
            if kind == "suffix":
                r.suffix.pop(key)
                r.prefix[self.group[key]] -= 1
            else:
                r.prefix.pop(key)
        return True

    def _victim(self, r: _Replica):
        if r.suffix:
            if self.policy == "session_affine":  # the idle agent expected back latest
                return "suffix", max(r.suffix, key=lambda a: self.next_at[a])
            return "suffix", next(iter(r.suffix))  # least recently used
        running = {self.group[q.agent] for q in r.running}
        free = [g for g, n in r.prefix.items() if n == 0 and g not in running]
        return ("prefix", free[0]) if free else None

    def _step(self, r: _Replica) -> float:
        budget, prefill = self.w.chunk, 0
        decoding = [q for q in r.running if q.prefill_left == 0]
        for q in r.running:
            if q.prefill_left and budget:
                take = min(budget, q.prefill_left)
                q.prefill_left -= take
                budget -= take
                prefill += take
        for q in decoding:
            q.decode_left -= 1
        dt = self.m.step(len(decoding), prefill)
        r.busy += dt
        return dt

    def _step_end(self, t: float, r: _Replica) -> None:
        done = [q for q in r.running if q.decode_left == 0]
        for q in done:
            r.running.remove(q)
            self._finish(t, r, q)
        r.stepping = False
        self._kick(t, r)

    def _finish(self, t: float, r: _Replica, q: _Req) -> None:
        a, g = q.agent, self.group[q.agent]
        self.latencies.append(t - q.arrival + self.m.call_overhead)
        if self.turn[a] > 0:  # past each agent's first call (the start burst): the steady state
            self.steady.append(self.latencies[-1])
        self.history[a] += self.w.output_tokens
        r.prefix.setdefault(g, 0)
        r.prefix[g] += 1
        r.suffix[a] = self.history[a]
        r.suffix.move_to_end(a)
        self.turn[a] += 1
        if self.turn[a] < self.w.turns:
            tool = self.w.tool_s[g] * self.rng.uniform(0.8, 1.2)
            self.next_at[a] = t + self.w.tool_s[g]
            self._push(t + self.m.call_overhead + tool, "call", a)
        else:
            self.next_at[a] = math.inf


POLICIES = ("round_robin", "least_loaded", "prefix_affine", "session_affine")


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def simulate(policy: str, workload: Workload, model: StepModel) -> dict:
    return Sim(policy, workload, model).run()
