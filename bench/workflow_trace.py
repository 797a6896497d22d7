"""Where two scheduling policies part (issue 47, item 2): the same workflow tasks through two
policies with the per-decision trace on (`EngineConfig.decision_trace`, scheduling/trace.py), on
the real core over a cost model (agentrt.sim: deterministic, so the traces agree until the
policies do), and the first decision where their orders differ, printed with each side's
candidates and score terms; then, per policy, the prefix churn that followed (prefix pages
evicted per agent, decisions, mean JCT).

    python -m bench.workflow_trace [--dag diamond] [--a lpm] [--b topas] [--tasks 20] [--prefix 2000]
                                   [--load 8] [--room 1.25] [--costs bench/costs/gpu_h100_8b.json]

Writes bench/results/workflow_trace.json (both traces' first divergence and the churn summary).
"""

from __future__ import annotations

import argparse
from collections import Counter

from agentrt import DEFAULT_MODEL, load_model
from agentrt.conversation.chat_format import ChatFormat
from agentrt.model.config import ModelConfig
from agentrt.sim import SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from bench.common import machine, write_results
from bench.sim_workflows import COSTS, ROOM, WORK_SHARE, engine_config, sizes_for
from bench.workflow_run import run_dag
from bench.workflow_workload import DAGS, make_dag, make_tasks


def traced_run(policy: str, model, costs, fmt, dag, tasks, sizes, cfg) -> tuple[dict, list[dict]]:
    """One policy on `tasks`; (the run's figures, its decision trace)."""
    got: dict = {}

    async def capture(eng) -> None:
        got["trace"] = eng.decision_trace()

    cfg = cfg.replace(scheduling_policy=policy, decision_trace=1 << 20)
    res = sim_run(run_dag, model, fmt, dag, tasks, sizes, cfg, 1e6, False, SimExecutor(model, costs), None, capture)
    return res, got["trace"]


def first_divergence(a: list[dict], b: list[dict], sets: bool = False) -> int | None:
    """Index of the first decision whose order differs (`sets`: whose admitted set differs; an
    order that differs only among requests admitted together is a tie); None: none within the
    shorter trace."""
    for i, (x, y) in enumerate(zip(a, b)):
        if (set(x["admitted"]) != set(y["admitted"])) if sets else (x["order"] != y["order"]):
            return i
    return None


def churn(trace: list[dict], page_size: int) -> dict:
    """Prefix pages evicted per agent and in all: a leaf's pages that lie wholly inside its
    agent's static prefix (a session's suffix starts on the prefix's last, partial page: that
    leaf is the session's, not the prefix's). An agent's prefix is the shortest length the
    engine learned for it (learned from its requests' common prefix, it shrinks to the static
    part as requests arrive)."""
    plen: dict = {}
    for rec in trace:
        for a, n in rec["prefix_len"].items():
            if n > 0:
                plen[a] = min(plen.get(a, n), n)
    per: Counter = Counter()
    for rec in trace:
        for e in rec["evicted"]:
            inside = min(e["start"] + e["tokens"], plen.get(e["agent"], 0)) - e["start"]
            if inside >= page_size:
                per[e["agent"]] += inside // page_size
    return {"decisions": len(trace), "prefix_pages_evicted": sum(per.values()), "per_agent": dict(per)}


def show(name: str, rec: dict) -> None:
    print(f"\n--- {name}: decision {rec['index']} at t={rec['now']:.3f} s")
    print("  resident prefixes:", {a: n for a, n in rec["resident"].items() if n}, " prefix_len:", rec["prefix_len"])
    print("  running:", [r["key"] for r in rec["running"]])
    for c in rec["ready"]:
        print(f"  ready {c['key']:28s} resident {c['resident']:5d} cells {c['cells']:5d} work {c['work']:5d} "
              f"remaining {c['remaining_s']:.3f} s")
    print("  order:", rec["order"], " admitted:", rec["admitted"], " keep:", rec["keep"])
    for t in rec["terms"]:
        print("  term", t)
    if rec["evicted"]:
        print("  evicted before it:", rec["evicted"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dag", default="diamond", choices=DAGS)
    ap.add_argument("--a", default="lpm")
    ap.add_argument("--b", default="topas")
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--prefix", type=int, default=2000)
    ap.add_argument("--load", type=float, default=8.0)
    ap.add_argument("--room", type=float, default=ROOM)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--costs", default=None, help="a cost model (default: the H100 one)")
    a = ap.parse_args()
    costs = StepCosts.load(a.costs or sorted(COSTS.glob("gpu_*h100*.json"))[0])
    model = SimModel(ModelConfig(**{**costs.details["model"], "rope_freq_factors": None}))
    tok = load_model(DEFAULT_MODEL).tokenizer
    fmt, sizes = ChatFormat(tok), sizes_for(a.prefix)
    dag = make_dag(fmt, tok, a.dag, sizes)
    cfg = engine_config(sizes, len(dag.preds), a.room, WORK_SHARE)
    alone = sim_run(run_dag, model, fmt, dag, make_tasks(fmt, tok, dag, sizes, 2, 1.0, 1000), sizes, cfg, 1e6,
                    True, SimExecutor(model, costs))
    tasks = make_tasks(fmt, tok, dag, sizes, a.tasks, a.load * 2 / alone["busy_s"], a.seed)
    runs = {p: traced_run(p, model, costs, fmt, dag, tasks, sizes, cfg) for p in (a.a, a.b)}
    i = first_divergence(runs[a.a][1], runs[a.b][1])
    j = first_divergence(runs[a.a][1], runs[a.b][1], sets=True)
    out = {"machine": machine(), "dag": a.dag, "policies": [a.a, a.b], "tasks": a.tasks, "prefix_tokens": a.prefix,
           "load": a.load, "room_prefixes": a.room, "cost_model": costs.name, "first_divergence": i,
           "first_admission_divergence": j,
           "runs": {p: {"mean_jct_s": r["mean_jct_s"], "p99_jct_s": r["p99_jct_s"], "hit_rate": r["hit_rate"],
                        "completed": r["completed"], **churn(t, cfg.page_size)} for p, (r, t) in runs.items()}}
    for key, k in (("at_divergence", i), ("at_admission_divergence", j)):
        if k is None:
            continue
        out[key] = {p: runs[p][1][k] for p in (a.a, a.b)}
        print(f"\n===== {key.replace('_', ' ')}: decision {k}")
        for p in (a.a, a.b):
            show(p, runs[p][1][k])
    print()
    for p, r in out["runs"].items():
        print(f"{p:8s} mean JCT {r['mean_jct_s']:.2f} s  p99 {r['p99_jct_s']:.2f} s  hit {r['hit_rate']:.2f}  "
              f"decisions {r['decisions']}  prefix pages evicted {r['prefix_pages_evicted']}  {r['per_agent']}")
    print("wrote", write_results("workflow_trace", out))


if __name__ == "__main__":
    main()
