"""agentrt past one machine: a real Ray cluster on this machine, and a simulation to 64 replicas.

1. **Step-cost model** (measured here, one engine with 1 torch thread, as a replica of a 2-replica
   run gets): prefill s/token (a 512-token prompt), decode step s at batch 1 and 8 (so
   base + per-sequence), and the KV transfer s/token of a migration (snapshot -> restore between
   two replicas, from the real run).
2. **Real runs** on the embedded SmolLM2 (native quantization): A agents x T turns; a turn is one
   model call (a named tool call) and then its tool (a fixed sleep). The same workload on
   (a) one local Engine in this process and (b) a ClusterRuntime with 1 replica, 1 torch thread
   each: `ray_overhead_per_turn_ms` = median call latency (b) - (a). (a) against its own
   simulation gives the engine's fixed per-call cost off the steps; both fixed costs join the
   step model. Then (c) 2 replicas of 1 thread each, session-affine: its measured call latency is
   compared with the simulation's prediction for the same workload (`validation`).
3. **Simulation** (`bench/cluster_sim.py`) for 1-64 replicas and 100-10,000 agents (agents =
   40 per replica, clipped to [100, 10000]), 8 turns, 8 agent types sharing a 600-token prefix
   each, tool latencies 5-120 s by type, KV 16,384 tokens per replica (histories outgrow it: KV
   pressure): round-robin, least-loaded, prefix-affine (cache_aware routing) and session-affine
   with migration. Keys: `per_turn_speedup_session_affine_vs_prefix_affine_64` (mean per-turn
   latency, prefix-affine / session-affine, at 64 replicas), its p50/p99 and steady-state (past
   each agent's first call) variants, hit rates and imbalance per point; `step_model` (the inputs).

    python bench/bench_cluster.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cluster_sim import POLICIES, StepModel, Workload, simulate  # noqa: E402
from bench.common import machine, print_table, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CITIES = ["Paris", "Tokyo", "Oslo", "Lima", "Rome", "Cairo"]
TOOL_S = 0.5


def measure_step_model(lm) -> dict:
    """Prefill s/token and decode step s at batch 1 and 8 on one engine (1 torch thread)."""
    import torch

    from agentrt import Engine, EngineConfig, SamplingParams

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384, response_cache_size=0)) as eng:
            vocab = lm.config.vocab_size
            prefill = []
            for rep in range(3):  # (distinct first tokens: nothing comes from the prefix cache)
                prompt = [(i * 7919 + rep * 131) % (vocab - 100) + 50 for i in range(512)]
                t0 = time.perf_counter()
                await eng.complete(prompt, SamplingParams(max_tokens=1))
                prefill.append((time.perf_counter() - t0) / len(prompt))

            async def decode(tag: int) -> tuple[float, float]:
                stamps = []
                async for _ in eng.generate([60 + tag, 61, 62, 63], SamplingParams(max_tokens=33, ignore_eos=True)):
                    stamps.append(time.perf_counter())
                return stamps[1], stamps[-1]
            one = [await decode(0) for _ in range(2)]
            b1 = statistics.median((end - start) / 31 for start, end in one)
            many = await asyncio.gather(*(decode(i) for i in range(8)))
            b8 = (max(e for _, e in many) - max(s for s, _ in many)) / 31
        return {"prefill_per_token": statistics.median(prefill), "decode_step_b1": b1, "decode_step_b8": b8}
    try:
        return asyncio.run(main())
    finally:
        torch.set_num_threads(torch_threads)


def _agents(n: int, tool_log: list):
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


async def _drive(rt, refs, turns: int, ask) -> list[dict]:
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
            refs = [await rt.spawn(a) for a in _agents(n, [])]
            await _drive(rt, refs[:1], 1, lambda r, m: r.ask(m, timeout=600))  # warm-up
            return await _drive(rt, refs, turns, lambda r, m: r.ask(m, timeout=600))
    return asyncio.run(main())


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
            refs = [await rt.spawn(a) for a in _agents(n, [])]
            await _drive(rt, refs[:1], 1, lambda r, m: rt.ask(r, m, timeout=600))  # warm-up
            rows = await _drive(rt, refs, turns, lambda r, m: rt.ask(r, m, timeout=600))
            if migrate:  # the KV transfer cost of a migration: fixed + per token, from a short and a long session
                moves = []
                for ref in (refs[0], refs[1]):
                    if ref is refs[1]:  # make this one's history long: four more turns
                        await _drive(rt, [ref], 4, lambda r, m: rt.ask(r, m, timeout=600))
                    tokens = len(await ref.behavior.session.tokens())
                    t0 = time.perf_counter()
                    await rt.migrate(ref, 1 - rt.where[ref.name])
                    moves.append((tokens, time.perf_counter() - t0))
                (n0, s0), (n1, s1) = moves
                per_token = max(0.0, (s1 - s0) / max(1, n1 - n0))
                extra = {"migrations": moves, "transfer_per_token": per_token,
                         "transfer_fixed": max(0.0, s0 - per_token * n0)}
        return rows, extra
    return asyncio.run(main())


def _med(rows: list[dict], key: str = "call_s") -> float:
    return statistics.median(r[key] for r in rows)


def predict_real(rows: list[dict], model: StepModel, replicas: int, n: int, turns: int) -> float:
    """The simulation of the real run's workload: its measured prompt growth and output lengths."""
    prompts = sorted(r["prompt"] for r in rows if r["turn"] == 0)
    first = statistics.median(prompts)
    growth = statistics.median(b["prompt"] - a["prompt"] for a in rows for b in rows
                               if a["agent"] == b["agent"] and b["turn"] == a["turn"] + 1)
    out = round(statistics.median(r["output"] for r in rows))
    w = Workload(agents=n, replicas=replicas, turns=turns, groups=n, prefix_tokens=int(first), turn_tokens=int(growth - out),
                 output_tokens=out, tool_s=(TOOL_S,) * n, kv_tokens=16384, seed=1)
    return simulate("session_affine", w, model)["turn_s_p50"]


def sweep(model: StepModel, quick: bool) -> list[dict]:
    replicas = (1, 4, 16, 64) if quick else (1, 2, 4, 8, 16, 32, 64)
    out = []
    for r in replicas:
        agents = min(10000, max(100, 40 * r))
        w = Workload(agents=agents, replicas=r, turns=4 if quick else 8, tool_s=(5, 10, 20, 40, 60, 80, 100, 120),
                     kv_tokens=16384)
        for p in POLICIES:
            out.append(simulate(p, w, model))
    return out


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for p in POLICIES:
        pts = sorted((x for x in points if x["policy"] == p), key=lambda x: x["replicas"])
        xs = [x["replicas"] for x in pts]
        a.plot(xs, [x["turn_s_mean"] for x in pts], marker="o", label=p)
        b.plot(xs, [x["hit_rate"] for x in pts], marker="o", label=p)
    for ax, label in ((a, "mean per-turn latency (s)"), (b, "KV hit rate")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replicas (agents = 40 per replica, 100..10000)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    a.set_yscale("log")  # (1 replica: 100 agents, the floor of the agent range, overload it)
    a.legend()
    fig.suptitle("simulated placement policies under KV pressure (this machine's step-cost model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 agents x 3 turns for real, 4 replica counts (minutes)")
    args = ap.parse_args()
    from agentrt import load_model

    t_start = time.perf_counter()
    n, turns = (4, 3) if args.quick else (6, 5)
    lm = load_model("smollm2-135m")
    steps = measure_step_model(lm)
    local = run_local(lm, n, turns)
    one, _ = run_cluster(1, 1, n, turns)
    two, moved = run_cluster(2, 1, n, turns, migrate=True)
    per_seq = max(0.0, (steps["decode_step_b8"] - steps["decode_step_b1"]) / 7)
    bare = StepModel(prefill_per_token=steps["prefill_per_token"], decode_base=steps["decode_step_b1"] - per_seq,
                     decode_per_seq=per_seq, transfer_per_token=moved["transfer_per_token"],
                     transfer_fixed=moved["transfer_fixed"])
    # the fixed per-call costs the steps do not show: the engine's off-step work (from the local
    # run against its own simulation), then Ray's (1 replica against the local engine)
    engine_overhead = max(0.0, _med(local) - predict_real(local, bare, 1, n, turns))
    ray_overhead = _med(one) - _med(local)
    model = dataclasses.replace(bare, call_overhead=engine_overhead + max(0.0, ray_overhead))
    predicted = predict_real(two, model, 2, n, turns)
    points = sweep(model, args.quick)
    by = {(x["policy"], x["replicas"]): x for x in points}
    top = max(x["replicas"] for x in points)
    sa, pa = by[("session_affine", top)], by[("prefix_affine", top)]
    out = {
        "machine": machine(), "quick": args.quick, "agents_real": n, "turns_real": turns, "tool_s": TOOL_S,
        "step_model": {**steps, "decode_base": model.decode_base, "decode_per_seq": model.decode_per_seq,
                       "engine_call_overhead": engine_overhead, "call_overhead": model.call_overhead, **moved},
        "real": {"local_call_s_p50": _med(local), "cluster1_call_s_p50": _med(one), "cluster2_call_s_p50": _med(two),
                 "cluster2_prefill_fraction": sum(r["computed"] for r in two) / sum(r["prompt"] for r in two)},
        "ray_overhead_per_turn_ms": ray_overhead * 1e3,
        "validation": {"policy": "session_affine", "replicas": 2, "measured_call_s_p50": _med(two),
                       "predicted_call_s_p50": predicted, "predicted_over_measured": predicted / _med(two)},
        f"per_turn_speedup_session_affine_vs_prefix_affine_{top}": pa["turn_s_mean"] / sa["turn_s_mean"],
        f"p99_ratio_session_affine_vs_prefix_affine_{top}": pa["turn_s_p99"] / sa["turn_s_p99"],
        f"p50_speedup_session_affine_vs_prefix_affine_{top}": pa["turn_s_p50"] / sa["turn_s_p50"],
        f"steady_per_turn_speedup_session_affine_vs_prefix_affine_{top}": pa["steady_turn_s_mean"] / sa["steady_turn_s_mean"],
        f"steady_p99_ratio_session_affine_vs_prefix_affine_{top}": pa["steady_turn_s_p99"] / sa["steady_turn_s_p99"],
        f"hit_rate_session_affine_vs_prefix_affine_{top}": [sa["hit_rate"], pa["hit_rate"]],
        "simulation": points, "bench_wall_s": time.perf_counter() - t_start,
    }
    rows = [[x["policy"], x["replicas"], x["agents"], f"{x['turn_s_mean']:.2f}", f"{x['turn_s_p50']:.2f}",
             f"{x['turn_s_p99']:.2f}",
             f"{x['hit_rate']:.2f}", f"{x['imbalance']:.2f}", x["migrations"]] for x in points]
    print_table("simulated placement (KV 16k tokens/replica)", ["policy", "replicas", "agents", "turn mean s",
                "turn p50 s", "turn p99 s", "hit rate", "imbalance", "migrations"], rows)
    print({k: v for k, v in out.items() if not isinstance(v, (list, dict))})
    print("real:", out["real"], "validation:", out["validation"])
    plot(points, ROOT / "bench" / "results" / "cluster.png")
    print("wrote", write_results("cluster", out))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    main()
