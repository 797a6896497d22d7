"""The real runs of bench_cluster.py: A agents x T turns (a named tool call, then a fixed-sleep
tool) on one local Engine in this process, or on a Ray ClusterRuntime of R replicas; each call's
latency (tool excluded) and usage, and for a 2-replica cluster the measured cost of a session's
migration (fixed + per token, from a short and a long session)."""

from __future__ import annotations

import asyncio
import statistics
import time

from bench.common import ROOT

CITIES = ["Paris", "Tokyo", "Oslo", "Lima", "Rome", "Cairo"]
TOOL_S = 0.5


def _agents(n: int):
    from agentrt import Agent, SamplingParams, tool

    @tool
    async def get_weather(city: str) -> dict:
        """Current weather in a city.

        Args:
            city: the city name
        """
        await asyncio.sleep(TOOL_S)
        return {"city": city, "temperature_c": 10 + len(city), "sky": "clear"}

    return [Agent(f"agent{i}", f"You are weather agent {i}. Look the weather up with get_weather.", [get_weather],
                  tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tool_rounds=1,
                  stop_at_tools=["get_weather"], settings=SamplingParams(max_tokens=32)) for i in range(n)]


async def _drive(refs, turns: int, ask) -> list[dict]:
    rows: list[dict] = []

    async def one(i, ref):
        for t in range(turns):
            t0 = time.perf_counter()
            result = await ask(ref, f"What is the weather in {CITIES[(i + t) % len(CITIES)]}?")
            u = result.usage[0]
            rows.append({"agent": i, "turn": t, "call_s": time.perf_counter() - t0 - TOOL_S,
                         "prompt": u.prompt_tokens, "computed": u.computed_prompt_tokens,
                         "output": u.completion_tokens})
    await asyncio.gather(*(one(i, r) for i, r in enumerate(refs)))
    return rows


def run_local(lm, n: int, turns: int, threads: int = 1) -> list[dict]:
    import torch

    from agentrt import Engine, EngineConfig, Runtime

    torch.set_num_threads(threads)

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384, response_cache_size=0)) as eng, Runtime(eng) as rt:
            refs = [await rt.spawn(a) for a in _agents(n)]
            await _drive(refs[:1], 1, lambda r, m: r.ask(m, timeout=600))  # warm-up
            return await _drive(refs, turns, lambda r, m: r.ask(m, timeout=600))
    return asyncio.run(main())


async def _migrations(rt, refs) -> dict:
    """The KV transfer cost of a migration: fixed + per token, from a short and a long session."""
    moves = []
    for ref in (refs[0], refs[1]):
        if ref is refs[1]:  # make this one's history long: four more turns
            await _drive([ref], 4, lambda r, m: rt.ask(r, m, timeout=600))
        tokens = len(await ref.behavior.session.tokens())
        t0 = time.perf_counter()
        await rt.migrate(ref, 1 - rt.where[ref.name])
        moves.append((tokens, time.perf_counter() - t0))
    (n0, s0), (n1, s1) = moves
    per_token = max(0.0, (s1 - s0) / max(1, n1 - n0))
    return {"migrations": moves, "transfer_per_token": per_token, "transfer_fixed": max(0.0, s0 - per_token * n0)}


def run_cluster(replicas: int, threads: int, n: int, turns: int, migrate: bool = False) -> tuple[list[dict], dict]:
    from agentrt import EngineConfig
    from agentrt.integrations.ray import ClusterRuntime, ModelSpec

    async def main():
        extra: dict = {}
        async with ClusterRuntime(ModelSpec("smollm2-135m"), replicas=replicas, threads_per_replica=threads,
                                  cpus_per_replica=threads, engine_config=EngineConfig(kv_cache_tokens=16384,
                                                                                       response_cache_size=0),
                                  ray_init={"num_cpus": replicas * threads,
                                            "runtime_env": {"env_vars": {"PYTHONPATH": str(ROOT)}}}) as rt:
            refs = [await rt.spawn(a) for a in _agents(n)]
            await _drive(refs[:1], 1, lambda r, m: rt.ask(r, m, timeout=600))  # warm-up
            rows = await _drive(refs, turns, lambda r, m: rt.ask(r, m, timeout=600))
            if migrate:
                extra = await _migrations(rt, refs)
        return rows, extra
    return asyncio.run(main())


def med(rows: list[dict], key: str = "call_s") -> float:
    return statistics.median(r[key] for r in rows)
