"""Agents on R engine replicas, simulated: each replica a real `agentrt.Engine` on a simulated
executor (agentrt.sim: the core's own admission, scheduling, radix cache, eviction, retention
and preemption over a step cost model), all of them on one virtual clock (`agentrt.sim.run`),
with placement and migration on top (bench/cluster_route.py: round_robin, least_loaded,
prefix_affine, session_affine).

Agents run closed loops: a model call (the prompt is the group's shared prefix plus the agent's
history: each turn adds `turn_tokens` of user / tool-result tokens, then the call's
`output_tokens` synthetic tokens, ScriptBook), then a tool of the agent's type (a fixed latency
per type, +-20% jitter, slept in virtual time), for `turns` turns; starts are spread over the
first tool interval. A call also spends `Overheads.call_overhead` off the replica (driver, RPC,
parsing: measured by bench_cluster). For round_robin, least_loaded and prefix_affine every call
is a transient request routed on its own (`engine.complete(prompt, params)`); for
session_affine each agent holds a session on its replica (`engine.open_session`), tells it the
tool it waits on (`Session.expect_tools`: tool-aware retention), and moves with it. Replicas
have no host tier unless `tier_bytes` says so (KV pressure is the point).

Outputs per run: per-turn latency mean/p50/p99 (call start -> last token, overhead included),
the same past each agent's first call (`steady_*`: the first calls land in a burst), KV hit rate
(prompt tokens served from cache / prompt tokens, from every call's usage), load imbalance
(max / mean replica busy time), migrations, preemptions, virtual seconds and the simulation's
own wall seconds (`sim_wall_s`).

Scale: the real core is simulated step by step, so the simulator's wall time grows with agent
turns and with agents per replica (measured here: 4-6 ms per agent turn at 40 agents per
replica, 17 ms at 1,000 agents on one engine). bench_cluster --quick (1-8 replicas, 100-320
agents, 4 turns, four policies) takes about 45 s; 16 replicas x 640 agents x 8 turns about 30 s
per policy. Estimated from those rates: the full sweep (to 64 replicas x 2,560 agents x 8 turns)
about 4 minutes per policy, 10,000 agents x 8 turns on 250 replicas about 8. Runs repeat
exactly (agentrt.sim.run is deterministic).

    from bench.cluster_sim import Workload, simulate
    simulate("session_affine", Workload(agents=100, replicas=4), StepCosts.load("bench/results/cost_cpu.json"))
"""

from __future__ import annotations

import random
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import anyio

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import ConfigError
from agentrt.model.config import ModelConfig
from agentrt.sim import ScriptBook, SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from bench.cluster_route import POLICIES, Overheads, Router

__all__ = ["POLICIES", "Overheads", "Workload", "simulate", "sim_model"]

# the shape of the model the CPU cost model was calibrated on (SmolLM2-135M): for cost models
# whose details carry no "model" (the GPU ones do)
SMOLLM2_135M = ModelConfig(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                           num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                           max_position_embeddings=8192, tie_word_embeddings=True)
TOKENS = (1000, 30000)  # prompt token ids are drawn from [lo, hi)


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
    n_batch: int = 4096  # tokens per step (EngineConfig.n_batch)
    tier_bytes: int = 0  # host tier per replica (EngineConfig.kv_tier_bytes)
    migrate_gap: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("agents", "replicas", "turns", "groups", "prefix_tokens", "turn_tokens", "output_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"Workload.{name} must be an int >= 1, got {v!r}")
        if len(self.tool_s) < self.groups or any(not t >= 0 for t in self.tool_s):
            raise ConfigError(f"Workload.tool_s needs a latency >= 0 for each of the {self.groups} groups, "
                              f"got {self.tool_s!r}")

    def engine_config(self) -> EngineConfig:
        return EngineConfig(kv_cache_tokens=self.kv_tokens, kv_tier_bytes=self.tier_bytes, n_batch=self.n_batch,
                            max_session_seqs=self.agents, max_transient_seqs=self.agents, response_cache_size=0,
                            enable_speculation=False, acquire_timeout=1e6)


@dataclass
class Record:
    """What the driver saw of the run: per-call latencies and usage, and (trace) every call."""

    latencies: list[float] = field(default_factory=list)
    steady: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    calls: list[dict] | None = None

    def add(self, agent: int, turn: int, replica: int, prompt: list[int], out, seconds: float) -> None:
        self.latencies.append(seconds)
        if turn > 0:
            self.steady.append(seconds)
        self.prompt_tokens += out.usage.prompt_tokens
        self.cached_tokens += out.usage.cached_tokens
        if self.calls is not None:
            self.calls.append({"agent": agent, "turn": turn, "replica": replica, "prompt": tuple(prompt),
                               "output": tuple(out.token_ids), "cached": out.usage.cached_tokens})


def sim_model(costs: StepCosts) -> SimModel:
    """The model shape a cost model was made for (details["model"]; else SmolLM2-135M's)."""
    shape = costs.details.get("model") if isinstance(costs.details, dict) else None
    if shape is None:
        return SimModel(SMOLLM2_135M)
    return SimModel(ModelConfig(**{**shape, "rope_freq_factors": None}))


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKENS) for _ in range(n)]


class Driver:
    """The agents' closed loops over the replicas, through the router."""

    def __init__(self, policy: str, w: Workload, engines: list[Engine], costs: StepCosts, over: Overheads,
                 trace: bool) -> None:
        self.w, self.engines, self.over = w, engines, over
        self.router = Router(policy, engines, costs, over, w.migrate_gap, w.output_tokens)
        self.sessions = policy == "session_affine"
        self.params = SamplingParams(max_tokens=w.output_tokens, ignore_eos=True)
        self.prefixes = [_ids(random.Random(w.seed * 7919 + g), w.prefix_tokens) for g in range(w.groups)]
        self.record = Record(calls=[] if trace else None)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for a in range(self.w.agents):
                tg.start_soon(self.agent, a)

    async def agent(self, a: int) -> None:
        w, g = self.w, a % self.w.groups
        rng = random.Random(w.seed * 1_000_003 + a)
        await anyio.sleep(rng.uniform(0, w.tool_s[g]))
        prompt, session = list(self.prefixes[g]), None
        for turn in range(w.turns):
            prompt += _ids(rng, w.turn_tokens)
            t0 = anyio.current_time()
            await anyio.sleep(self.over.call_overhead)
            session, out = await self.call(a, g, prompt, session)
            self.record.add(a, turn, out.replica, prompt, out.completion, anyio.current_time() - t0)
            prompt += out.completion.token_ids
            if turn < w.turns - 1:
                await self.tool(session, g, w.tool_s[g] * rng.uniform(0.8, 1.2))
        if session is not None:
            await session.close()

    async def call(self, a: int, g: int, prompt: list[int], session):
        if self.sessions:
            r, session = await self.router.session_for(a, session, f"group{g}", len(prompt))
        else:
            r = self.router.route(prompt)
        self.router.inflight[r] += 1
        try:
            done = await self.engines[r].complete(prompt, self.params, session=session, tag=f"group{g}")
        finally:
            self.router.inflight[r] -= 1
        return session, Placed(r, done)

    async def tool(self, session, g: int, seconds: float) -> None:
        t0 = anyio.current_time()
        if session is not None:  # tool-aware retention: the session's KV is kept for the tool's time
            await session.expect_tools([f"tool{g}"])
        await anyio.sleep(max(0.0, seconds - (anyio.current_time() - t0)))


@dataclass(frozen=True)
class Placed:
    replica: int
    completion: object


def _q(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(policy: str, w: Workload, d: Driver, executors: list[SimExecutor], engines: list[Engine],
            virtual_s: float) -> dict:
    lat, steady, rec = sorted(d.record.latencies), sorted(d.record.steady), d.record
    busy = [ex.busy_s for ex in executors]
    out = {"policy": policy, "agents": w.agents, "replicas": w.replicas, "turns": len(lat),
           "turn_s_mean": sum(lat) / len(lat), "turn_s_p50": _q(lat, 0.5), "turn_s_p99": _q(lat, 0.99),
           "steady_turn_s_mean": sum(steady) / max(1, len(steady)), "steady_turn_s_p50": _q(steady, 0.5),
           "steady_turn_s_p99": _q(steady, 0.99), "hit_rate": rec.cached_tokens / max(1, rec.prompt_tokens),
           "imbalance": max(busy) / (sum(busy) / len(busy)) if sum(busy) else 1.0,
           "migrations": d.router.migrations, "preemptions": sum(e.stats().preemptions for e in engines),
           "steps": sum(ex.steps for ex in executors), "virtual_s": virtual_s}
    if rec.calls is not None:
        out["calls"] = rec.calls
    return out


async def _simulate(policy: str, w: Workload, costs: StepCosts, over: Overheads, trace: bool) -> dict:
    model, book = sim_model(costs), ScriptBook()
    executors = [SimExecutor(model, costs, book) for _ in range(w.replicas)]
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(Engine(model, w.engine_config(), executor=ex)) for ex in executors]
        driver = Driver(policy, w, engines, costs, over, trace)
        t0 = anyio.current_time()
        await driver.run()
        return summary(policy, w, driver, executors, engines, anyio.current_time() - t0)


def simulate(policy: str, workload: Workload, costs: StepCosts, overheads: Overheads | None = None, *,
             trace: bool = False) -> dict:
    """One run of `workload` under placement `policy` (POLICIES) on simulated replicas priced by
    `costs`; `trace`: the result's "calls" lists every call (agent, turn, replica, prompt,
    output, cached tokens)."""
    if policy not in POLICIES:
        raise ConfigError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not isinstance(costs, StepCosts):
        raise ConfigError(f"costs must be a StepCosts (agentrt.sim), got {type(costs).__name__}")
    t0 = time.perf_counter()
    out = sim_run(_simulate, policy, workload, costs, overheads or Overheads(), trace)
    out["sim_wall_s"] = time.perf_counter() - t0
    return out
