"""agentrt past one machine: a real Ray cluster on this machine, and simulated engine replicas to 64.

1. **Step costs**: this machine's cost model (agentrt.sim: `calibrate` run at 1 torch thread, as a
   replica of a 2-replica run gets; or `--costs PATH`), and the KV transfer cost of a migration
   (snapshot -> restore between two replicas, fixed + per token, from the real run).
2. **Real runs** on the embedded SmolLM2 (native quantization): A agents x T turns; a turn is one
   model call (a named tool call) and then its tool (a fixed sleep). The same workload on
   (a) one local Engine in this process and (b) a ClusterRuntime with 1 replica, 1 torch thread
   each: `ray_overhead_per_turn_ms` = median call latency (b) - (a). (a) against its own
   simulation gives the engine's fixed per-call cost off the steps; both fixed costs are the
   simulation's `call_overhead`. Then (c) 2 replicas of 1 thread each, session-affine: its
   measured call latency is compared with the simulation's prediction (`validation`).
3. **Simulation** (`bench/cluster_sim.py`: each replica a real Engine on a simulated executor,
   all on one virtual clock): 1-64 replicas (--quick: 1-8), agents = 40 per replica clipped to
   [100, 10000] (--agents-per-replica, --max-agents), 8 turns (--quick: 4), 8 agent types sharing
   a 600-token prefix each, tool latencies 5-120 s by type, KV 16,384 tokens per replica and no
   host tier (histories outgrow it: KV pressure): round-robin, least-loaded, prefix-affine
   (cache_aware routing) and session-affine with migration. Keys:
   `per_turn_speedup_session_affine_vs_prefix_affine_<R>` (mean per-turn latency, prefix-affine /
   session-affine, at the most replicas R), its p50/p99 and steady-state (past each agent's first
   call) variants, hit rates, imbalance and the simulator's wall seconds per point;
   `step_costs` and `overheads` (the inputs). --quick's simulation takes about a minute here;
   the full sweep about 20 minutes (bench/cluster_sim.py says what sizes are practical).

`--sim-only` skips 1-2 (no model, no Ray): the cost model from --costs (default
bench/results/cost_cpu.json), the overheads from the last bench/results/cluster.json; it writes
bench/results/cluster_sim.json.

    python -m bench.bench_cluster [--quick] [--sim-only] [--costs PATH] [--replicas 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from agentrt.sim import StepCosts  # noqa: E402
from bench.cluster_real import TOOL_S, med, run_cluster, run_local  # noqa: E402
from bench.cluster_sim import POLICIES, Overheads, Workload, simulate  # noqa: E402
from bench.common import RESULTS, ROOT, machine, print_table, write_results  # noqa: E402

OVERHEADS = ("call_overhead", "transfer_fixed", "transfer_per_token")


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="4 agents x 3 turns for real; 1-8 replicas x 4 turns simulated")
    ap.add_argument("--sim-only", action="store_true", help="the simulation alone (no model, no Ray)")
    ap.add_argument("--costs", default=None,
                    help="a StepCosts JSON (default: calibrate now; --sim-only: cost_cpu.json)")
    ap.add_argument("--replicas", default=None, help="replica counts (default 1,2,4,8 --quick / 1,2,4,8,16,32,64)")
    ap.add_argument("--agents-per-replica", type=int, default=40)
    ap.add_argument("--max-agents", type=int, default=10000)
    ap.add_argument("--turns", type=int, default=None, help="turns per simulated agent (default 4 --quick / 8)")
    a = ap.parse_args()
    a.replicas = [int(r) for r in (a.replicas or ("1,2,4,8" if a.quick else "1,2,4,8,16,32,64")).split(",")]
    a.turns = a.turns or (4 if a.quick else 8)
    return a


def calibrated_costs(lm, quick: bool) -> StepCosts:
    """This machine's cost model with 1 torch thread (a replica's share here)."""
    import torch

    from agentrt.sim.calibrate import calibrate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return calibrate(lm, quick=quick, name="cpu, 1 torch thread (calibrated)")
    finally:
        torch.set_num_threads(threads)


def predict_real(rows: list[dict], costs: StepCosts, over: Overheads, replicas: int, n: int, turns: int) -> float:
    """The simulation of a real run's workload (its measured prompt growth and output lengths):
    its median call latency."""
    first = statistics.median(r["prompt"] for r in rows if r["turn"] == 0)
    growth = statistics.median(b["prompt"] - a["prompt"] for a in rows for b in rows
                               if a["agent"] == b["agent"] and b["turn"] == a["turn"] + 1)
    out = max(1, round(statistics.median(r["output"] for r in rows)))
    turn = max(1, int(growth) - out)
    w = Workload(agents=n, replicas=replicas, turns=turns, groups=n, prefix_tokens=max(1, int(first) - turn),
                 turn_tokens=turn, output_tokens=out, tool_s=(TOOL_S,) * n, kv_tokens=16384, seed=1)
    return simulate("session_affine", w, costs, over)["turn_s_p50"]


def measure(a) -> tuple[StepCosts, Overheads, dict]:
    """Steps 1-2: the cost model, the overheads and the real runs (with the validation)."""
    from agentrt import load_model

    n, turns = (4, 3) if a.quick else (6, 5)
    lm = load_model("smollm2-135m")
    costs = StepCosts.load(a.costs) if a.costs else calibrated_costs(lm, a.quick)
    local = run_local(lm, n, turns)
    one, _ = run_cluster(1, 1, n, turns)
    two, moved = run_cluster(2, 1, n, turns, migrate=True)
    bare = Overheads(transfer_fixed=moved["transfer_fixed"], transfer_per_token=moved["transfer_per_token"])
    # the fixed per-call costs the steps do not show: the engine's off-step work (the local run
    # against its own simulation), then Ray's (1 replica against the local engine)
    engine_overhead = max(0.0, med(local) - predict_real(local, costs, bare, 1, n, turns))
    ray_overhead = med(one) - med(local)
    over = Overheads(engine_overhead + max(0.0, ray_overhead), bare.transfer_fixed, bare.transfer_per_token)
    predicted = predict_real(two, costs, over, 2, n, turns)
    return costs, over, {
        "agents_real": n, "turns_real": turns, "tool_s": TOOL_S, "engine_call_overhead": engine_overhead,
        "migrations_measured": moved["migrations"], "ray_overhead_per_turn_ms": ray_overhead * 1e3,
        "real": {"local_call_s_p50": med(local), "cluster1_call_s_p50": med(one), "cluster2_call_s_p50": med(two),
                 "cluster2_prefill_fraction": sum(r["computed"] for r in two) / sum(r["prompt"] for r in two)},
        "validation": {"policy": "session_affine", "replicas": 2, "measured_call_s_p50": med(two),
                       "predicted_call_s_p50": predicted, "predicted_over_measured": predicted / med(two)}}


def last_overheads() -> Overheads:
    """--sim-only: the overheads of the last full run (bench/results/cluster.json), else none."""
    try:
        data = json.loads((RESULTS / "cluster.json").read_text())
    except (OSError, ValueError):
        return Overheads()
    got = data.get("overheads") or data.get("step_model") or {}
    return Overheads(**{k: float(got[k]) for k in OVERHEADS if k in got})


def sweep(costs: StepCosts, over: Overheads, a) -> list[dict]:
    out = []
    for r in a.replicas:
        agents = min(a.max_agents, max(100, a.agents_per_replica * r))
        w = Workload(agents=agents, replicas=r, turns=a.turns, tool_s=(5, 10, 20, 40, 60, 80, 100, 120),
                     kv_tokens=16384)
        for p in POLICIES:
            out.append(simulate(p, w, costs, over))
            x = out[-1]
            print(f"{r:3d} replicas {agents:5d} agents {p:15s} turn mean {x['turn_s_mean']:.2f} s "
                  f"p99 {x['turn_s_p99']:.2f} s hit {x['hit_rate']:.2f}  ({x['sim_wall_s']:.1f} s wall)", flush=True)
    return out


def comparison(points: list[dict]) -> dict:
    by = {(x["policy"], x["replicas"]): x for x in points}
    top = max(x["replicas"] for x in points)
    sa, pa = by[("session_affine", top)], by[("prefix_affine", top)]
    steady = pa["steady_turn_s_mean"] / sa["steady_turn_s_mean"]
    return {
        f"per_turn_speedup_session_affine_vs_prefix_affine_{top}": pa["turn_s_mean"] / sa["turn_s_mean"],
        f"p99_ratio_session_affine_vs_prefix_affine_{top}": pa["turn_s_p99"] / sa["turn_s_p99"],
        f"p50_speedup_session_affine_vs_prefix_affine_{top}": pa["turn_s_p50"] / sa["turn_s_p50"],
        f"steady_per_turn_speedup_session_affine_vs_prefix_affine_{top}": steady,
        f"steady_p99_ratio_session_affine_vs_prefix_affine_{top}": pa["steady_turn_s_p99"] / sa["steady_turn_s_p99"],
        f"hit_rate_session_affine_vs_prefix_affine_{top}": [sa["hit_rate"], pa["hit_rate"]]}


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
    fig.suptitle("simulated engine replicas under KV pressure: placement policies (this machine's cost model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(points: list[dict]) -> None:
    rows = [[x["policy"], x["replicas"], x["agents"], f"{x['turn_s_mean']:.2f}", f"{x['turn_s_p50']:.2f}",
             f"{x['turn_s_p99']:.2f}", f"{x['hit_rate']:.2f}", f"{x['imbalance']:.2f}", x["migrations"],
             f"{x['sim_wall_s']:.1f}"] for x in points]
    print_table("simulated replicas (KV 16k tokens/replica)", ["policy", "replicas", "agents", "turn mean s",
                "turn p50 s", "turn p99 s", "hit rate", "imbalance", "migrations", "sim wall s"], rows)


def main() -> None:
    a = parse()
    t_start = time.perf_counter()
    out: dict = {"machine": machine(), "quick": a.quick, "sim_only": a.sim_only}
    if a.sim_only:
        costs, over = StepCosts.load(a.costs or RESULTS / "cost_cpu.json"), last_overheads()
    else:
        costs, over, real = measure(a)
        out.update(real)
    out.update(step_costs=costs.__dict__, overheads={k: getattr(over, k) for k in OVERHEADS})
    t_sim = time.perf_counter()
    points = sweep(costs, over, a)
    out.update(comparison(points), simulation=points, sim_wall_s=time.perf_counter() - t_sim,
               bench_wall_s=time.perf_counter() - t_start)
    report(points)
    print({k: v for k, v in out.items() if not isinstance(v, (list, dict))})
    if not a.sim_only:
        print("real:", out["real"], "validation:", out["validation"])
        plot(points, ROOT / "bench" / "results" / "cluster.png")
    print("wrote", write_results("cluster_sim" if a.sim_only else "cluster", out))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    main()
