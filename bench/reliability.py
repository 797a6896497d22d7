"""Reliability report (issue 30): the malformed-body corpus, the whole-surface fuzz and the soak,
in one JSON (bench/results/reliability.json).

  * corpus: every probe of bench/workloads/malformed.py against `agentrt serve` (tiny model, two
    API keys): the status codes returned, how many were 5xx (must be 0), whether each named the
    expected field, and whether the server answered a valid request after all of them;
  * fuzz: tests/test_fuzz_surface.py run by pytest (its examples and operations), with the
    operations run and the typed errors raised (`AGENTRT_FUZZ_COUNTS`);
  * soak: bench/soak.py (64 agents over 16 session ids; `--quick`: 4 turns each), its leaks,
    next-output mismatches, asks that ended in PoolExhausted, passivations and RSS growth;
  * radix property: tests/test_radix_property.py with its examples, steps and operations counted
    (`AGENTRT_RADIX_COUNTS`; full: 2,000 examples, `--quick` 400);
  * tight pool: the seed's regime (a KV pool of 1.25 stage prefixes, 2,000-token prefixes, 20
    tasks per DAG at 8x load) on the real core over the simulator's H100 cost model, FCFS, LPM
    and TOPAS on the three DAGs: tasks completed, admissions, preemptions and their ratio (<= 1).

    python -m bench.reliability [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.common import RESULTS, ROOT, machine  # noqa: E402
from bench.workloads.malformed import PROBES  # noqa: E402


def corpus() -> dict:
    from agentrt import EngineConfig
    from agentrt.server import ServerConfig, ServerThread
    from bench.soak import tiny_model

    key = "reliability-key-0"
    cfg = ServerConfig(port=0, api_keys=(key, "reliability-key-1"), max_tokens_limit=256, max_request_bytes=1 << 20)
    statuses, named, wrong = Counter(), 0, []
    with ServerThread(tiny_model(), cfg, EngineConfig(kv_cache_tokens=8192)) as s:
        h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        for p in PROBES:
            data = p["raw"] if "raw" in p else json.dumps(p["body"]).encode()
            r = httpx.post(s.url + p["path"], content=data, headers=h, timeout=120)
            statuses[r.status_code] += 1
            param = r.json().get("error", {}).get("param")
            ok = r.status_code == p["status"] and (p["param"] is None or param == p["param"])
            named += ok
            if not ok:
                wrong.append({"probe": p["name"], "status": r.status_code, "param": param})
        live = httpx.post(s.url + "/chat/completions", headers=h, timeout=120,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).status_code == 200
    return {"bodies_tried": len(PROBES), "status_codes": {str(k): v for k, v in sorted(statuses.items())},
            "server_errors_5xx": sum(v for k, v in statuses.items() if k >= 500),
            "as_expected": named, "unexpected": wrong, "server_live_after": live}


def fuzz() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts.json"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_fuzz_surface.py", "tests/test_fuzz_api.py"], cwd=ROOT,
                              env={**os.environ, "AGENTRT_FUZZ_COUNTS": str(out)}, capture_output=True, text=True)
        counts = json.loads(out.read_text()) if out.exists() else {}
    ops = {k[3:]: v for k, v in counts.items() if k.startswith("op:")}
    return {"passed": proc.returncode == 0, "summary": proc.stdout.strip().splitlines()[-1:],
            "operations": ops, "operations_total": sum(ops.values()),
            "completed": {k[3:]: v for k, v in counts.items() if k.startswith("ok:")},
            "typed_errors": {k[6:]: v for k, v in counts.items() if k.startswith("error:")},
            "http_status_codes": {k[5:]: v for k, v in counts.items() if k.startswith("http:")},
            "untyped_errors": 0 if proc.returncode == 0 else "see the pytest output",
            "wall_s": round(time.perf_counter() - t0, 1)}


def soak(quick: bool) -> dict:
    out = RESULTS / "soak.json"
    proc = subprocess.run([sys.executable, "-m", "bench.soak", *(["--quick"] if quick else [])], cwd=ROOT)
    data = json.loads(out.read_text())
    keys = ("agents", "session_ids", "turns", "passivations", "activations", "leaked_pages", "leaked_session_ids",
            "next_output_mismatches", "pool_exhausted", "acquire_timeout_s", "rss_growth_mb", "rss_mb_start",
            "rss_mb_end", "ok", "cancelled", "typed_errors", "typed_errors_by_type", "tool_errors", "preemptions",
            "wall_s")
    return {"passed": proc.returncode == 0, **{k: data.get(k) for k in keys}}


def radix_property(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "counts.json"
        t0 = time.perf_counter()
        env = {**os.environ, "AGENTRT_RADIX_COUNTS": str(out), "AGENTRT_RADIX_EXAMPLES": "400" if quick else "2000"}
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_radix_property.py"], cwd=ROOT, env=env, capture_output=True, text=True)
        counts = json.loads(out.read_text()) if out.exists() else {}
    return {"passed": proc.returncode == 0, "summary": proc.stdout.strip().splitlines()[-1:],
            "examples": counts.get("examples", 0), "steps": counts.get("steps", 0),
            "operations": {k[3:]: v for k, v in counts.items() if k.startswith("op:")},
            "preemptions": counts.get("preemptions", 0), "evicted_pages": counts.get("evicted_pages", 0),
            "wall_s": round(time.perf_counter() - t0, 1)}


def tight_pool() -> dict:
    from agentrt import DEFAULT_MODEL, load_model
    from agentrt.conversation.chat_format import ChatFormat
    from agentrt.model.config import ModelConfig
    from agentrt.sim import SimExecutor, SimModel, StepCosts
    from agentrt.sim import run as sim_run
    from bench.sim_workflows import COSTS, engine_config, sizes_for
    from bench.workflow_run import run_dag
    from bench.workflow_workload import DAGS, make_dag, make_tasks

    costs = StepCosts.load(sorted(COSTS.glob("gpu_*h100*.json"))[0])
    model = SimModel(ModelConfig(**{**costs.details["model"], "rope_freq_factors": None}))
    tok = load_model(DEFAULT_MODEL).tokenizer
    fmt, sizes, runs = ChatFormat(tok), sizes_for(2000), []
    for name in DAGS:
        dag = make_dag(fmt, tok, name, sizes)
        cfg = engine_config(sizes, len(dag.preds))
        alone = sim_run(run_dag, model, fmt, dag, make_tasks(fmt, tok, dag, sizes, 2, 1.0, 1000), sizes, cfg,
                        1e6, True, SimExecutor(model, costs))
        tasks = make_tasks(fmt, tok, dag, sizes, 20, 8 * 2 / alone["busy_s"], 7)
        for policy in ("fcfs", "lpm", "topas"):
            r = sim_run(run_dag, model, fmt, dag, tasks, sizes, cfg.replace(scheduling_policy=policy), 1e6, False,
                        SimExecutor(model, costs))
            runs.append({"dag": name, "policy": policy, "kv_cache_tokens": cfg.kv_cache_tokens,
                         "tasks": r["tasks"], "completed": r["completed"], "admissions": r["admissions"],
                         "preemptions": r["preemptions"], "error": r.get("error"),
                         "preemptions_per_admission": r["preemptions"] / max(1, r["admissions"])})
    return {"cost_model": costs.name, "prefix_tokens": 2000, "room_prefixes": 1.25, "tasks_per_dag": 20,
            "load": 8, "runs": runs, "all_completed": all(x["completed"] == x["tasks"] for x in runs),
            "max_preemptions_per_admission": max(x["preemptions_per_admission"] for x in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the soak's 4-turn run")
    ap.add_argument("--out", type=Path, default=RESULTS / "reliability.json")
    args = ap.parse_args()
    res = {"corpus": corpus(), "fuzz": fuzz(), "soak": soak(args.quick), "radix_property": radix_property(args.quick),
           "tight_pool": tight_pool(), "machine": machine(), "quick": args.quick,
           "commands": ["python -m bench.reliability" + (" --quick" if args.quick else "")]}
    res["leaks"] = {"pages": res["soak"]["leaked_pages"], "session_ids": res["soak"]["leaked_session_ids"]}
    res["rss_growth_mb"] = res["soak"]["rss_growth_mb"]
    res["pool_exhausted"] = res["soak"]["pool_exhausted"]
    res["max_preemptions_per_admission"] = res["tight_pool"]["max_preemptions_per_admission"]
    print(json.dumps(res, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    ok = res["corpus"]["server_errors_5xx"] == 0 and res["fuzz"]["passed"] and res["soak"]["passed"] \
        and res["radix_property"]["passed"] and res["tight_pool"]["all_completed"] \
        and res["max_preemptions_per_admission"] <= 1
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
