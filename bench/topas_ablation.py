"""TOPAS's missing half, measured (issue 60, part 1): the options of scheduling/topas.py that admit
by task age inside the resident stage and leave a stage for the oldest waiting task's once it has
full batches ready, each against TOPAS as it is and LPM, on the same tasks, in the simulated GPU
regime of bench/sim_workflows.py (the H100 cost model, a pool of about 1.25 stage prefixes, the
seed's three DAGs). Virtual time: deterministic, and it may share the machine.

Reported per variant and DAG: mean and p99 JCT (median over the task sets), and the mean-JCT
reduction against LPM per task set; `best_variant` per DAG. Variants are `name=admission:switch`
(admission "locality" or "age"; switch: EngineConfig.topas_switch_full, 0 = never).

    python -m bench.topas_ablation [--quick] [--tasks 100] [--seeds 7,8] [--load 8] [--variants ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from agentrt import DEFAULT_MODEL, load_model
from agentrt.conversation.chat_format import ChatFormat
from agentrt.model.config import ModelConfig
from agentrt.sim import SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from bench.common import machine, print_table, write_results
from bench.sim_workflows import COSTS, ROOM, WORK_SHARE, engine_config, sizes_for
from bench.workflow_run import run_dag
from bench.workflow_workload import DAGS, make_dag, make_tasks

VARIANTS = ("topas=locality:0", "age=age:0", "switch1=locality:1", "switch2=locality:2", "age_switch1=age:1")


def parse_variant(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition("=")
    admission, _, switch = rest.partition(":")
    return name, {"scheduling_policy": "topas", "topas_admission": admission or "locality",
                  "topas_switch_full": float(switch or 0)}


def one_dag(dag_name: str, costs: StepCosts, fmt, tok, n: int, load: float, seeds: list[int],
            variants: list[str]) -> dict:
    model = SimModel(ModelConfig(**{**costs.details["model"], "rope_freq_factors": None}))
    sizes = sizes_for(3000)
    dag = make_dag(fmt, tok, dag_name, sizes)
    cfg = engine_config(sizes, len(dag.preds), ROOM, WORK_SHARE)
    alone = sim_run(run_dag, model, fmt, dag, make_tasks(fmt, tok, dag, sizes, 2, 1.0, 1000), sizes, cfg, 1e6,
                    True, SimExecutor(model, costs))
    runs: dict[str, list[dict]] = {}
    for seed in seeds:
        tasks = make_tasks(fmt, tok, dag, sizes, n, load * 2 / alone["busy_s"], seed)
        for name, changes in [("lpm", {"scheduling_policy": "lpm"}), *map(parse_variant, variants)]:
            r = sim_run(run_dag, model, fmt, dag, tasks, sizes, cfg.replace(**changes), 1e6, False,
                        SimExecutor(model, costs))
            runs.setdefault(name, []).append({k: r.get(k) for k in ("mean_jct_s", "p99_jct_s", "hit_rate", "steps",
                                                                     "prompt_computed", "completed")})
            print(f"{dag_name:8s} seed {seed} {name:12s} mean JCT {r['mean_jct_s']:.2f} s  p99 {r['p99_jct_s']:.2f} s"
                  f"  hit {r['hit_rate']:.2f}  steps {r['steps']}", flush=True)
    out: dict = {"variants": {}}
    for name, rs in runs.items():
        red = [1 - r["mean_jct_s"] / b["mean_jct_s"] for r, b in zip(rs, runs["lpm"])]
        red99 = [1 - r["p99_jct_s"] / b["p99_jct_s"] for r, b in zip(rs, runs["lpm"])]
        out["variants"][name] = {"mean_jct_s": statistics.median(r["mean_jct_s"] for r in rs),
                                 "p99_jct_s": statistics.median(r["p99_jct_s"] for r in rs),
                                 "hit_rate": statistics.median(r["hit_rate"] for r in rs),
                                 "mean_jct_reduction_vs_lpm_per_seed": red, "mean_jct_reduction_vs_lpm": statistics.fmean(red),
                                 "p99_jct_reduction_vs_lpm": statistics.fmean(red99), "runs": rs}
    out["best_variant"] = max((n for n in out["variants"] if n != "lpm"),
                              key=lambda n: out["variants"][n]["mean_jct_reduction_vs_lpm"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 tasks, seeds 7 and 8")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per DAG (--quick 100; full 200)")
    ap.add_argument("--seeds", default=None, help="task sets (--quick 7,8; full 7,8,9)")
    ap.add_argument("--load", type=float, default=8.0, help="arrival rate, x one-at-a-time capacity")
    ap.add_argument("--dags", default=",".join(DAGS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="name=admission:switch_full, comma-separated")
    ap.add_argument("--costs", default=str(COSTS / "gpu_llama3_8b_h100.json"))
    a = ap.parse_args()
    costs = StepCosts.load(a.costs)
    tok = load_model(DEFAULT_MODEL).tokenizer  # (ids for the prompts; the weights are not run)
    n = a.tasks or (100 if a.quick else 200)
    seeds = [int(s) for s in (a.seeds or ("7,8" if a.quick else "7,8,9")).split(",")]
    variants = a.variants.split(",")
    res: dict = {"machine": machine(), "quick": a.quick, "tasks": n, "seeds": seeds, "load": a.load,
                 "cost_model": costs.name, "dags": {}}
    for d in a.dags.split(","):
        res["dags"][d] = one_dag(d, costs, ChatFormat(tok), tok, n, a.load, seeds, variants)
    rows = [[d, name, v["mean_jct_s"], v["p99_jct_s"], v["hit_rate"], v["mean_jct_reduction_vs_lpm"],
             v["p99_jct_reduction_vs_lpm"]] for d, r in res["dags"].items() for name, v in r["variants"].items()]
    print_table(f"TOPAS variants vs LPM, simulated ({costs.name}, {a.load}x)",
                ["dag", "variant", "mean JCT", "p99 JCT", "hit", "mean red. vs LPM", "p99 red. vs LPM"], rows)
    res["best_variant"] = {d: r["best_variant"] for d, r in res["dags"].items()}
    res["command"] = "python -m bench.topas_ablation " + " ".join(sys.argv[1:])
    print("wrote", write_results("topas_ablation", res))


if __name__ == "__main__":
    main()
