"""Workflow-aware scheduling (issue 15, seed 004): FCFS, LPM, SRPT, program-level FCFS and TOPAS
on the same multi-agent workloads, one run, on the embedded SmolLM2 (native quantization).

Synthetic DAGs (bench/workflow_workload.py): chain A->B->C, fan-out/fan-in A->{B1,B2,B3}->D,
diamond A->{B,C}->D; every stage an agent with its own static prefix (400 tokens; --quick 300) making 1-2
tool-calling calls (forced output length, simulated tools). Poisson task arrivals at two or more
load levels, calibrated against the measured service time (one task at a time, FCFS); the same
tasks and arrival times for every policy. The KV pool holds about `--pool-prefixes` agents'
prefixes plus the running requests' working set; `kv_tier_bytes=0` (an evicted prefix is
recomputed), response cache off. One fresh engine per (DAG, load, policy), same model object.
Plus a LangGraph planner -> worker -> reviewer graph through `agent_node` at one load
(bench/workflow_langgraph.py). JCT per task = completion of its last stage - its arrival.
Writes bench/results/workflows.json and workflows.png.
    python -m bench.bench_workflows [--quick] [--dags chain,diamond] [--policies fcfs,topas] [--tasks 8]
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import time
import traceback
from pathlib import Path

import anyio

from agentrt import DEFAULT_MODEL, Engine, EngineConfig, SamplingParams, load_model  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from agentrt.scheduling.policies import SCHEDULING_POLICIES  # noqa: E402
from bench.common import RESULTS, machine, write_results  # noqa: E402
from bench.workflow_report import headline, plot, print_tables  # noqa: E402
from bench.workflow_run import combine_reps, reductions, run_dag  # noqa: E402
from bench.workflow_workload import DAGS, Sizes, make_dag, make_tasks, task_tokens  # noqa: E402

TARGET = "topas"


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 tasks per run, 300-token prefixes (~5 min idle, ~8 shared)")
    ap.add_argument("--dags", default=",".join(DAGS))
    ap.add_argument("--policies", default=",".join(SCHEDULING_POLICIES))
    ap.add_argument("--loads", default=None, help="arrival rates as fractions of the measured capacity "
                                                  "(default 0.8,1.4): the capacity is measured one task at a time, "
                         "so batching lets the engine take somewhat more")
    ap.add_argument("--rates", default=None, help="absolute arrival rates (tasks/s), instead of --loads")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per run (--quick 4; full 10)")
    ap.add_argument("--reps", type=int, default=None, help="paired repetitions per policy, each with its own "
                    "tasks and arrivals (default 1; full 2); figures are medians over them")
    ap.add_argument("--prefix-tokens", type=int, default=None, help="per agent (--quick 300; full 400)")
    ap.add_argument("--out-tokens", type=int, default=None, help="forced output per call (--quick 8; full 12)")
    ap.add_argument("--pool-prefixes", type=float, default=2.0, help="KV pool = this many prefixes + working set")
    ap.add_argument("--working-tokens", type=int, default=None,
                    help="working set of the running requests in the pool (default 4 x (user + result + 2 outputs))")
    ap.add_argument("--lg-tasks", type=int, default=None, help="LangGraph tasks (default 3; full 6; 0: skip)")
    ap.add_argument("--lg-load", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--run-timeout", type=float, default=None, help="seconds per run (default 150; full 400)")
    ap.add_argument("--quant", default="auto", choices=["auto", "native", "none", "int8"])
    ap.add_argument("--out", default=str(RESULTS / "workflows.json"))
    a = ap.parse_args()
    q = a.quick
    a.loads = [float(x) for x in (a.loads or "0.8,1.4").split(",")]
    a.rates = [float(x) for x in a.rates.split(",")] if a.rates else None
    a.tasks = a.tasks or (4 if q else 10)
    a.reps = a.reps or (1 if q else 2)
    a.prefix_tokens = a.prefix_tokens or (300 if q else 400)
    a.out_tokens = a.out_tokens or (8 if q else 12)
    a.lg_tasks = (3 if q else 6) if a.lg_tasks is None else a.lg_tasks
    a.run_timeout = a.run_timeout or (150.0 if q else 400.0)
    a.dags = [d for d in a.dags.split(",") if d]
    a.policies = [p for p in a.policies.split(",") if p]
    for p in a.policies:
        if p not in SCHEDULING_POLICIES:
            ap.error(f"unknown policy {p!r}; choose from {SCHEDULING_POLICIES}")
    for d in a.dags:
        if d not in DAGS:
            ap.error(f"unknown DAG {d!r}; choose from {DAGS}")
    return a


def base_config(a, sizes: Sizes) -> EngineConfig:
    work = a.working_tokens or 4 * (sizes.user_tokens[1] + sizes.result_tokens[1] + 2 * sizes.out_tokens)
    kv = math.ceil((a.pool_prefixes * a.prefix_tokens + work) / 16) * 16
    # speculation off: outputs are forced random text, so every policy runs the same decode steps
    return EngineConfig(kv_cache_tokens=kv, kv_tier_bytes=0, response_cache_size=0, enable_speculation=False,
                        max_transient_seqs=128, acquire_timeout=3600.0)


def run_policy(fn, *args) -> dict:
    try:
        return anyio.run(fn, *args)
    except Exception as e:  # noqa: BLE001 - a policy that fails is reported, the others still run
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        tb = traceback.extract_tb(e.__traceback__)[-1:]
        where = f" ({Path(tb[0].filename).name}:{tb[0].lineno})" if tb else ""
        return {"error": f"{type(e).__name__}: {e}{where}"[:400]}


def poisson(n: int, rate: float, seed: int) -> list[float]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(1.0) / rate if i else 0.0
        out.append(t)
    return out


def warmup(lm, cfg) -> None:
    async def go():
        async with Engine(lm, cfg) as eng:
            await eng.complete(list(range(100, 400)), SamplingParams(max_tokens=4, ignore_eos=True))
    anyio.run(go)


def main() -> None:
    a = parse()
    t_start = time.perf_counter()
    sizes = Sizes(prefix_tokens=a.prefix_tokens, out_tokens=a.out_tokens)
    lm = load_model(DEFAULT_MODEL, quantize=a.quant)
    fmt = ChatFormat(lm.tokenizer)
    cfg = base_config(a, sizes)
    warmup(lm, cfg)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = None
    res: dict = {"machine": machine(), "quick": a.quick, "commit": commit, "policies": a.policies,
                 "target": TARGET, "seed": a.seed, "reps": a.reps, "quantize": a.quant, "tasks_per_run": a.tasks,
                 "sizes": {k: getattr(sizes, k) for k in sizes.__dataclass_fields__},
                 "engine": {"kv_cache_tokens": cfg.kv_cache_tokens, "pool_prefixes": a.pool_prefixes,
                            "kv_tier_bytes": 0, "response_cache_size": 0, "enable_speculation": False,
                            "cell_budget_fraction": cfg.cell_budget_fraction, "eviction_policy": cfg.eviction_policy},
                 "dags": {}}
    fcfs = cfg.replace(scheduling_policy="fcfs")
    for name in a.dags:
        dag = make_dag(fmt, lm.tokenizer, name, sizes)
        d = res["dags"][name] = {"stages": list(dag.workflow.stages), "edges": dag.workflow.edges, "loads": {}}
        if a.rates:
            levels = [(r, r) for r in a.rates]
        else:  # capacity: 1 / model-busy seconds per task, tasks run one at a time
            cal = make_tasks(fmt, lm.tokenizer, dag, sizes, 2, 1.0, a.seed + 1000)
            r = anyio.run(run_dag, lm, fmt, dag, cal, sizes, fcfs, a.run_timeout, True)
            d["service_s"] = r["busy_s"] / 2
            d["capacity_tasks_per_s"] = 1.0 / d["service_s"]
            levels = [(x, x * d["capacity_tasks_per_s"]) for x in a.loads]
            print(f"{name}: {d['service_s']:.2f} s of model time per task alone -> rates "
                  + ", ".join(f"{r:.3f}" for _, r in levels), flush=True)
        for load, rate in levels:
            tasks = make_tasks(fmt, lm.tokenizer, dag, sizes, a.tasks, rate, a.seed)
            d.setdefault("work", task_tokens(dag, tasks, sizes))
            L = d["loads"][f"load{load:g}"] = {"load": load, "rate": rate, "arrivals_s": [t.arrival for t in tasks],
                                               "policies": {}}
            if tasks[-1].arrival > 0:  # the sampled arrivals' own rate (few tasks: not the nominal one)
                L["realized_rate"] = (len(tasks) - 1) / tasks[-1].arrival
            reps: dict = {p: [] for p in a.policies}
            for k in range(a.reps):  # interleaved: a slow phase of the machine hits every policy alike
                tasks_k = tasks if k == 0 else make_tasks(fmt, lm.tokenizer, dag, sizes, a.tasks, rate, a.seed + 17 * k)
                for p in a.policies:
                    t0 = time.perf_counter()
                    r = run_policy(run_dag, lm, fmt, dag, tasks_k, sizes, cfg.replace(scheduling_policy=p),
                                   a.run_timeout)
                    reps[p].append(r)
                    print(f"  {name} load {load:g} ({rate:.3f}/s) rep {k} {p:13s} mean {r.get('mean_jct_s') or 0:.2f} s "
                          f"p99 {r.get('p99_jct_s') or 0:.2f} s  [{time.perf_counter() - t0:.0f} s] {r.get('error', '')}",
                          flush=True)
            for p in a.policies:
                L["policies"][p] = combine_reps(reps[p])
            L.update(reductions(L["policies"], TARGET))
    if a.lg_tasks > 0:
        res["langgraph"] = langgraph_case(a, lm, cfg, fcfs)
    headline(res)
    res["elapsed_s"] = time.perf_counter() - t_start
    print_tables(res)
    print({k: res[k] for k in ("mean_jct_reduction_vs_best_baseline", "p99_jct_reduction_vs_best_baseline",
                               "dags_reaching_goal", "decision_us_p50")})
    out = Path(a.out)
    print("wrote", write_results(out.stem, res) if out.parent == RESULTS else _write(out, res))
    print("plot", plot(res, out.with_suffix(".png")))
    print(f"elapsed {res['elapsed_s']:.0f} s")


def langgraph_case(a, lm, cfg, fcfs) -> dict:
    from bench.workflow_langgraph import run_langgraph

    prefix = max(a.prefix_tokens - 150, 64)  # instructions; the tool schema and template add the rest
    cal = anyio.run(run_langgraph, lm, fcfs, [0.0, 0.0], prefix, 24, a.seed + 1000, a.run_timeout, True)
    service = (cal["wall_s"] - 2 * 0.6) / 2  # tool sleeps (0.6 s per task) are not model time
    rate = a.lg_load / max(service, 1e-3)
    print(f"langgraph: {service:.2f} s per task alone -> rate {rate:.3f}", flush=True)
    arrivals = poisson(a.lg_tasks, rate, a.seed * 100 + 99)
    lg = {"load": a.lg_load, "rate": rate, "service_s": service, "arrivals_s": arrivals, "policies": {}}
    for p in a.policies:
        r = run_policy(run_langgraph, lm, cfg.replace(scheduling_policy=p), arrivals, prefix, 24, a.seed,
                       a.run_timeout)
        lg["policies"][p] = r
        print(f"  langgraph {p:13s} mean {r.get('mean_jct_s') or 0:.2f} s p99 {r.get('p99_jct_s') or 0:.2f} s "
              f"{r.get('error', '')}", flush=True)
    lg.update(reductions(lg["policies"], TARGET))
    return lg


def _write(path: Path, data: dict) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":
    main()
