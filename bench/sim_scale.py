"""The simulator at scale (bench_sim.py): many agents x turns on a GPU cost model.

Agents in groups of 10 share a 1,000-token system prompt (a team's instructions and tools);
each agent's conversation starts with it plus 50 tokens of its own, and each turn appends a
100-token message, gets a 48-token reply (synthetic, forced length) and then waits on a tool for
0.1-1.0 s (seeded). Agents start spread over the first 10 s. One session per agent, the real
engine core (default policies), on a virtual clock: the wall time measured is the simulator's
own cost."""

from __future__ import annotations

import random
import statistics
import time

import anyio

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.model.config import ModelConfig
from agentrt.sim import SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run

# KV pool tokens by GPU: memory left after 16 GB of weights, at 131 KB per token (Llama-3-8B, bf16)
KV_TOKENS = {"h100": 400_000, "rtx4090": 48_000}
SYSTEM, OWN, USER, REPLY = 1000, 50, 100, 48


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 30000) for _ in range(n)]


async def _workload(model: SimModel, costs: StepCosts, cfg: EngineConfig, agents: int, turns: int) -> dict:
    ex = SimExecutor(model, costs)
    lat: list[float] = []
    systems = [_ids(random.Random(g), SYSTEM) for g in range(-(-agents // 10))]
    async with Engine(model, cfg, executor=ex) as eng:
        t0 = anyio.current_time()

        async def agent(i: int) -> None:
            rng = random.Random(10_000 + i)
            await anyio.sleep(rng.uniform(0, 10))
            s = await eng.open_session(tag=f"team{i // 10}")
            prompt = systems[i // 10] + _ids(rng, OWN)
            for _ in range(turns):
                prompt = prompt + _ids(rng, USER)
                t = anyio.current_time()
                out = await eng.complete(prompt, SamplingParams(max_tokens=REPLY, ignore_eos=True), session=s)
                lat.append(anyio.current_time() - t)
                prompt = prompt + out.token_ids
                await anyio.sleep(rng.uniform(0.1, 1.0))
            await s.close()
        async with anyio.create_task_group() as tg:
            for i in range(agents):
                tg.start_soon(agent, i)
        st = eng.stats()
        return {"virtual_s": anyio.current_time() - t0, "turns": len(lat), "turn_s_mean": statistics.fmean(lat),
                "turn_s_p99": sorted(lat)[int(0.99 * (len(lat) - 1))], "hit_rate": st.hit_rate,
                "steps": ex.steps, "busy_s": ex.busy_s, "preemptions": st.preemptions}


def scale_run(costs: StepCosts, agents: int = 1000, turns: int = 10) -> dict:
    model = SimModel(ModelConfig(**{**costs.details["model"], "rope_freq_factors": None}))
    kv = next((v for k, v in KV_TOKENS.items() if k in costs.name.lower().replace(" ", "")), 100_000)
    cfg = EngineConfig(kv_cache_tokens=kv, max_session_seqs=agents, max_transient_seqs=8, response_cache_size=0,
                       enable_speculation=False, acquire_timeout=3600.0)
    t0 = time.perf_counter()
    out = sim_run(_workload, model, costs, cfg, agents, turns)
    return {"agents": agents, "turns_per_agent": turns, "kv_cache_tokens": kv,
            "sim_wall_s": time.perf_counter() - t0, **out}
