"""Tables, headline keys and the plot of bench_workflows.py."""

from __future__ import annotations

from bench.common import RESULTS, print_table
from bench.workflow_run import median_or_none

GOAL = 0.30


def _f(x, scale: float = 1.0):
    return "-" if x is None else x * scale


def print_tables(res: dict) -> None:
    errors = []
    for dag, d in res["dags"].items():
        rows = []
        for lk, L in d["loads"].items():
            for p, r in L["policies"].items():
                rows.append([f"{L['rate']:.3f}", p, f"{r.get('completed', 0)}/{r.get('tasks', 0)}",
                             _f(r.get("mean_jct_s")), _f(r.get("p50_jct_s")), _f(r.get("p99_jct_s")),
                             _f(r.get("hit_rate")), r.get("prompt_computed", "-"), _f(r.get("decision_us_p50"))])
                if r.get("error"):
                    errors.append(f"{dag} {lk} {p}: {r['error']}")
            rows.append([lk, "topas/best", "", _f(L["mean_jct_reduction_vs_best_baseline"]), "",
                         _f(L["p99_jct_reduction_vs_best_baseline"]), "", "", ""])
        print_table(f"{dag}: JCT (s) per policy; last row per load: 1 - topas / best baseline",
                    ["rate/s", "policy", "done", "mean", "p50", "p99", "hit", "computed", "dec us"], rows)
    lg = res.get("langgraph")
    if lg:
        rows = [[p, f"{r.get('completed', 0)}/{r.get('tasks', 0)}", _f(r.get("mean_jct_s")), _f(r.get("p50_jct_s")),
                 _f(r.get("p99_jct_s")), _f(r.get("hit_rate"))] for p, r in lg["policies"].items()]
        errors += [f"langgraph {p}: {r['error']}" for p, r in lg["policies"].items() if r.get("error")]
        rows.append(["topas/best", "", _f(lg["mean_jct_reduction_vs_best_baseline"]), "",
                     _f(lg["p99_jct_reduction_vs_best_baseline"]), ""])
        print_table(f"LangGraph planner->worker->reviewer at {lg['rate']:.3f} tasks/s: JCT (s)",
                    ["policy", "done", "mean", "p50", "p99", "hit"], rows)
    for e in errors:
        print("error:", e)


def headline(res: dict) -> None:
    """Top-level keys: per DAG the reductions at the highest load, DAGs reaching the goal,
    topas's decision time."""
    mean, p99 = {}, {}
    for dag, d in res["dags"].items():
        top = max(d["loads"].values(), key=lambda L: L["load"])
        mean[dag] = top["mean_jct_reduction_vs_best_baseline"]
        p99[dag] = top["p99_jct_reduction_vs_best_baseline"]
    res["mean_jct_reduction_vs_best_baseline"] = mean
    res["p99_jct_reduction_vs_best_baseline"] = p99
    res["dags_reaching_goal"] = sum(1 for v in mean.values() if v is not None and v >= GOAL)
    res["goal"] = f"mean_jct_reduction_vs_best_baseline >= {GOAL} on at least 2 of 3 DAGs (at the highest load)"
    topas = [r.get("decision_us_p50") for d in res["dags"].values() for L in d["loads"].values()
             for p, r in L["policies"].items() if p == "topas"]
    if res.get("langgraph"):
        topas.append(res["langgraph"]["policies"].get("topas", {}).get("decision_us_p50"))
    res["decision_us_p50"] = median_or_none(topas)
    res["decision_us_p50_per_policy"] = {
        p: median_or_none([r.get("decision_us_p50") for d in res["dags"].values() for L in d["loads"].values()
                           for q, r in L["policies"].items() if q == p]) for p in res["policies"]}


def plot(res: dict, path=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(res["dags"]) + (["langgraph"] if res.get("langgraph") else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    colors = dict(zip(res["policies"], plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, name in zip(axes[0], panels):
        if name == "langgraph":
            lg = res["langgraph"]
            loads = {"lg": {"rate": lg["rate"], "policies": lg["policies"]}}
        else:
            loads = res["dags"][name]["loads"]
        for p in res["policies"]:
            pts = sorted((L["rate"], L["policies"].get(p, {}).get("mean_jct_s"), L["policies"].get(p, {}).get("p99_jct_s"))
                         for L in loads.values())
            pts = [x for x in pts if x[1] is not None]
            if not pts:
                continue
            xs = [x[0] for x in pts]
            ax.plot(xs, [x[1] for x in pts], "o-", color=colors[p], label=f"{p} mean",
                    lw=2.2 if p == "topas" else 1.2)
            ax.plot(xs, [x[2] for x in pts], "x--", color=colors[p], alpha=0.6, lw=1)
        ax.set_title(f"{name} (dashed: p99)")
        ax.set_xlabel("arrival rate (tasks/s)")
        ax.set_ylabel("JCT (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"JCT vs arrival rate per scheduling policy ({'quick' if res['quick'] else 'full'})", fontsize=10)
    fig.tight_layout()
    path = path or RESULTS / "workflows.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
