"""Simulation against reality (issue 28): the engine core's real admission, scheduling, caching,
eviction, tier, retention and preemption code on a cost model and a virtual clock (agentrt.sim),
validated against real runs of the same workloads on this machine, then run at a scale this
machine cannot reach.

1. Calibrate this machine's step cost model (agentrt.sim.calibrate: real engine steps timed
   over decode and prefill shapes, non-negative least squares) -> bench/results/cost_cpu.json.
2. Validation: bench_workflows' DAG workloads (Poisson arrivals at `--load` x the measured
   capacity), each scheduling policy run for real (its outputs recorded) and simulated (the
   recorded outputs replayed, so every prompt, and every cache hit, is the real run's); report
   simulated / measured for mean JCT, per-turn latency, TTFT and hit rate, and whether the
   policies rank the same by mean JCT: every pair of policies whose real mean JCTs differ by more
   than the real runs' own spread (repetitions, at least 5%) must be ordered the same by the
   simulation (`ranking_agrees`; pairs closer than that are ties the measurement cannot order).
3. bench_agents' memory cases (bench/sim_memory.py; --quick: 8 agents at 60% and 40% pools), each
   agentrt system (the KV hierarchy, without its tier, prefix cache + LRU) run for real and
   simulated from the same scripts: simulated / measured per-call latency, TTFT, hit rate, and
   whether the systems rank the same.
4. Scale: 1,000 agents x 10 turns (groups sharing a 1,000-token system prompt, tools taking
   0.1-1 s) simulated on the published-figure GPU models (bench/costs/*.json; --quick: the H100
   one): the wall time of the simulation itself, and the simulated per-turn latency and hit rate.
Writes bench/results/sim.json.

    python -m bench.bench_sim [--quick] [--costs bench/results/cost_cpu.json] [--no-real]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import anyio

from agentrt import DEFAULT_MODEL, EngineConfig, load_model  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from agentrt.sim import StepCosts  # noqa: E402
from agentrt.sim.calibrate import calibrate  # noqa: E402
from bench.common import RESULTS, machine, print_table, write_results  # noqa: E402
from bench.sim_compare import ranking, summary  # noqa: E402
from bench.sim_memory import METRICS as MEMORY_METRICS  # noqa: E402
from bench.sim_memory import memory_validation
from bench.sim_scale import scale_run  # noqa: E402
from bench.workflow_run import SIM_METRICS, measured_and_simulated, run_dag  # noqa: E402
from bench.workflow_workload import Sizes, make_dag, make_tasks  # noqa: E402

COSTS = Path(__file__).resolve().parent / "costs"
METRICS = SIM_METRICS  # step_s: the engine's step time


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 DAGs x 3 policies, 4 tasks each, quick calibration")
    ap.add_argument("--costs", default=None, help="a calibrated CPU cost model (default: calibrate now)")
    ap.add_argument("--dags", default=None, help="default chain,diamond (--quick) / chain,fanout,diamond")
    ap.add_argument("--policies", default=None, help="default fcfs,lpm,topas (--quick) / all five")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per run (--quick 4; full 8)")
    ap.add_argument("--load", type=float, default=1.2, help="arrival rate as a multiple of the measured capacity")
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--reps", type=int, default=2, help="real runs per policy (their spread is the noise)")
    a = ap.parse_args()
    a.dags = (a.dags or ("chain,diamond" if a.quick else "chain,fanout,diamond")).split(",")
    a.policies = (a.policies or ("fcfs,lpm,topas" if a.quick else "fcfs,lpm,srpt,program_fcfs,topas")).split(",")
    a.tasks = a.tasks or (4 if a.quick else 8)
    return a


def engine_config(sizes: Sizes) -> EngineConfig:
    work = 4 * (sizes.user_tokens[1] + sizes.result_tokens[1] + 2 * sizes.out_tokens)
    kv = (2 * sizes.prefix_tokens + work + 15) // 16 * 16  # about two agents' prefixes + the working set
    return EngineConfig(kv_cache_tokens=kv, kv_tier_bytes=0, response_cache_size=0, enable_speculation=False,
                        max_transient_seqs=128, acquire_timeout=3600.0)


def validate(a, lm, costs) -> dict:
    fmt, sizes = ChatFormat(lm.tokenizer), Sizes(prefix_tokens=300, out_tokens=8)
    cfg, out = engine_config(sizes), {}
    for name in a.dags:
        dag = make_dag(fmt, lm.tokenizer, name, sizes)
        cal = make_tasks(fmt, lm.tokenizer, dag, sizes, 2, 1.0, 1000)
        alone = anyio.run(run_dag, lm, fmt, dag, cal, sizes, cfg, 600.0, True)
        rate = a.load * 2 / alone["busy_s"]
        tasks = make_tasks(fmt, lm.tokenizer, dag, sizes, a.tasks, rate, 4)
        case = out[name] = {"rate": rate, "policies": {}}
        for p in a.policies:
            r = case["policies"][p] = measured_and_simulated(lm, fmt, dag, tasks, sizes, cfg.replace(scheduling_policy=p), costs,
                                                 a.reps)
            print(f"{name} {p:13s} real mean JCT {r['real']['mean_jct_s'] or 0:.2f} s  sim {r['sim']['mean_jct_s'] or 0:.2f} s"
                  f"  sim/real " + " ".join(f"{m} {v:.2f}" for m, v in r["sim_over_real"].items() if v), flush=True)
        tol = max([0.05] + [r["real"]["spread"] or 0.0 for r in case["policies"].values()])
        case.update(ranking(case["policies"], "mean_jct_s", tol))
    return out


def main() -> None:
    a = parse()
    res: dict = {"machine": machine(), "quick": a.quick}
    lm = load_model(DEFAULT_MODEL)
    if a.costs:
        costs = StepCosts.load(a.costs)
    else:
        costs = calibrate(lm, quick=a.quick)
        print("wrote", costs.save(RESULTS / "cost_cpu.json"))
    gpus = {p.stem: StepCosts.load(p) for p in sorted(COSTS.glob("gpu_*.json"))}
    res["cost_models"] = {"cpu": costs.__dict__, **{k: v.__dict__ for k, v in gpus.items()}}
    res["cases"] = validate(a, lm, costs)
    res.update(summary(res["cases"], "policies", METRICS))
    base = EngineConfig(response_cache_size=0, max_session_seqs=32, max_transient_seqs=32)  # (bench_agents')
    res["memory_cases"] = memory_validation(lm, ChatFormat(lm.tokenizer), costs, base, a.quick)
    res.update(summary(res["memory_cases"], "systems", MEMORY_METRICS, prefix="memory_"))
    rows = [[f"{n}/{p}", *(r["sim_over_real"][m] or "-" for m in METRICS), r["sim"]["sim_wall_s"]]
            for n, c in res["cases"].items() for p, r in c["policies"].items()]
    print_table("simulated / measured (CPU cost model)", ["case", *METRICS, "sim wall s"], rows)
    scale = {k: v for k, v in gpus.items() if not a.quick or "h100" in k}  # (--quick: the datacenter GPU)
    res["scale"] = {k: scale_run(v, a.agents, a.turns) for k, v in scale.items()}
    res["sim_wall_s_1000_agents"] = max(s["sim_wall_s"] for s in res["scale"].values())
    print_table(f"{a.agents} agents x {a.turns} turns, simulated", ["cost model", "sim wall s", "virtual s",
                "turn s mean", "hit rate"], [[k, s["sim_wall_s"], s["virtual_s"], s["turn_s_mean"], s["hit_rate"]]
                                             for k, s in res["scale"].items()])
    print("wrote", write_results("sim", res))


if __name__ == "__main__":
    main()
