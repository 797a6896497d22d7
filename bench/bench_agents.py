"""Multi-agent tool-calling benchmark: agentrt against what users would pick instead, one run.

Every workload (synthetic agents, BFCL v4 multi-turn replays) is a token-level script per agent
(bench/workloads/replay.py): each system gets the same prompts and force-decodes the same
outputs, on the same weights (the embedded SmolLM2-135M) and machine. Systems (bench/peers/):
agentrt full (sessions + radix + speculation + KV tier/prefetch/TTL pins), agentrt without
its second KV tier, agentrt stateless, agentrt prefix cache only under LRU (vLLM/SGLang-like),
transformers (full prompt every call), llama-cpp-python with one shared Llama and with one
Llama per agent. Ratios peer / agentrt (> 1: agentrt faster) are
computed per repetition, then summarised (median, p90).
Memory cases (bench/cases/memory_cases.py): 8 and 16 agents over a KV pool of 40-100% of their
histories, tool latencies drawn per tool; agentrt's KV memory hierarchy vs the same without its
second tier vs prefix cache + LRU; and session snapshot/restore vs prefill (bench/cases/snapshot_case.py).
Writes bench/results/agents.json and the plots agents_turns.png, agents_e2e.png, agents_memory.png.

    python -m bench.bench_agents [--quick] [--reps N] [--systems a,b] [--cases k,mem,snapshot]
                                 [--memory] [--merge] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio
import torch

from agentrt import EngineConfig, load_model  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from bench.agents_report import aggregate_ratios, aggregate_system, plot, print_case, ratios, summarize  # noqa: E402
from bench.agents_results import REQUIRED, headline, headline_sources, load_previous, merge  # noqa: E402,F401
from bench.cases import trace_case  # noqa: E402
from bench.cases.agents_cases import SYSTEMS, Case, SystemFactory, build_cases, kv_tokens  # noqa: E402
from bench.cases.ff_case import ff_cases, print_ff, run_ff
from bench.cases.ff_case import headline as ff_headline  # noqa: E402
from bench.cases.memory_cases import (  # noqa: E402
    DEFAULT_DIST,
    LONG_KEYS,
    MEMORY_KEYS,
    PLOT_ONLY_KEYS,
    case_extras,
    expand,
    memory_cases,
    plot_memory,
    print_memory,
)
from bench.common import RESULTS, machine  # noqa: E402
from bench.peers.base import NotRun  # noqa: E402
from bench.peers.llamacpp_peer import ensure_llama_cpp  # noqa: E402
from bench.workloads.latency import latency_stats  # noqa: E402
from bench.workloads.replay import script_stats  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small workloads, 1 repetition: minutes on 2 cores")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 1 quick, 3 full)")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"comma-separated subset of {','.join(SYSTEMS)} (agentrt always runs)")
    ap.add_argument("--cases", default=None, help="comma-separated subset of case keys (default: all); "
                    "'mem' = every memory case + the snapshot measurement, 'snapshot' = that alone")
    ap.add_argument("--memory", action="store_true", help="just the memory cases + snapshot (= --cases mem)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cases already in --out that this run does not run; headline keys from all")
    ap.add_argument("--tool-latency-dist", default=DEFAULT_DIST,
                    help="memory cases' tool latency: lognormal:MEDIAN:SIGMA | uniform:LO:HI | const:S | none "
                    "(per tool, seeded per repetition)")
    ap.add_argument("--out", type=Path, default=RESULTS / "agents.json", help="JSON output path")
    ap.add_argument("--quant", default="auto", choices=["auto", "native", "none", "int8"],
                    help="agentrt weights (see model/quant.py; auto = the GGUF's own Q4_1/Q8_0)")
    ap.add_argument("--tool-latency", type=float, default=0.0, help="seconds each tool call takes (0, 0.1, 0.5 ...)")
    ap.add_argument("--arrival", choices=["interleaved", "concurrent"], default=None,
                    help="override every case's arrival pattern")
    ap.add_argument("--distinct-prompts", action="store_true", help="one system prompt + tool set per agent")
    ap.add_argument("--sweep", action="store_true", help="also agents 1/4/8/16 x 6 turns, agentrt vs stateless")
    ap.add_argument("--run-timeout", type=float, default=3600.0,
                    help="seconds one system may take on one repetition of a case before it is reported failed")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(),
                    help="llama.cpp threads (default: torch's, so both use the same cores)")
    ap.add_argument("--no-ff", action="store_true",
                    help="skip the grammar fast-forward comparison on the bfcl and agents8 cases (bench/cases/ff_case.py)")
    ap.add_argument("--no-trace", action="store_true",
                    help="skip the tracing-overhead comparison (bench/cases/trace_case.py)")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install llama-cpp-python when it is missing (its rows: not run)")
    return ap.parse_args()


def run_case(case: Case, factory: SystemFactory, systems: list[str], reps: int, bar,
             timeout: float = 3600.0) -> dict:
    """Every repetition of one case: summaries per system, ratios vs agentrt per repetition."""
    runs: dict[str, list[dict]] = {}
    not_run: dict[str, str] = {}
    rep_ratios, workload = [], None
    for rep in range(reps):
        try:
            scripts = case.make(rep)
        except Exception as exc:  # e.g. the BFCL wheel cannot be downloaded
            bar.update(len(systems) * (reps - rep))
            if rep == 0:
                reason = f"workload unavailable: {type(exc).__name__}: {exc}"
                return _case_json(case, reps, {}, {n: reason for n in systems}, [], None)
            print(f"warning: {case.key} rep {rep + 1}: {exc}; kept {rep} rep(s)", file=sys.stderr)
            break
        workload = {**script_stats(scripts), **latency_stats(scripts),
                    "kv_cache_tokens": kv_tokens(scripts, case.pool_fraction)}
        summaries = {}
        for name in systems:
            bar.set_postfix_str(f"{case.key} rep {rep + 1}/{reps}: {name}")
            summary = _run_one(factory, name, scripts, case, workload["kv_cache_tokens"], not_run, timeout)
            bar.update(1)
            if summary is not None:
                summaries[name] = summary
                runs.setdefault(name, []).append(summary)
        if "agentrt" in summaries:
            rep_ratios.append({n: ratios(summaries["agentrt"], s) for n, s in summaries.items() if n != "agentrt"})
    return _case_json(case, reps, runs, not_run, rep_ratios, workload)


def _run_one(factory, name, scripts, case, kv, not_run, timeout) -> dict | None:
    """One system on one repetition's scripts; None (and the reason in not_run) if it cannot."""
    system = factory.get(name, kv)
    if isinstance(system, NotRun):
        not_run[name] = system.reason
        return None

    async def timed():
        with anyio.fail_after(timeout):
            return await system.run(scripts, case.arrival)

    try:
        if name not in factory.warmed:
            anyio.run(system.warmup)
            factory.warmed.add(name)
        summary = summarize(anyio.run(timed))
    except TimeoutError:
        not_run[name] = f"failed: no result within --run-timeout {timeout:.0f} s"
        return None
    except Exception as exc:  # a peer failing mid-run is reported, never dropped silently
        leaf = _leaf(exc)
        not_run[name] = f"failed: {type(leaf).__name__}: {leaf}"
        return None
    if not summary["exact"]:
        print(f"warning: {name} did not decode exactly the script in {case.key}", file=sys.stderr)
    return summary


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups: a task group's failure names
    what failed, not "unhandled errors in a TaskGroup"."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _case_json(case, reps, runs, not_run, rep_ratios, workload) -> dict:
    systems = {n: aggregate_system(r) for n, r in runs.items()}
    systems.update({n: {"status": "not run", "reason": why} for n, why in not_run.items() if n not in systems})
    return {"title": case.title, "arrival": case.arrival, "reps": reps, "workload": workload,
            "systems": systems, "ratios": aggregate_ratios(rep_ratios) if rep_ratios else {}}


def select_cases(args, fmt, tok) -> tuple[list[Case], bool]:
    """The cases to run and whether the snapshot measurement runs (all of them by default;
    --memory / --cases mem: the memory cases + snapshot)."""
    cases = build_cases(fmt, tok, quick=args.quick, tool_latency=args.tool_latency,
                        distinct=args.distinct_prompts, arrival=args.arrival, sweep=args.sweep)
    cases += memory_cases(fmt, tok, quick=args.quick, dist=args.tool_latency_dist,
                          distinct=args.distinct_prompts, arrival=args.arrival)
    wanted = args.cases.split(",") if args.cases else None
    if args.memory:
        wanted = (wanted or []) + ["mem"]
    if wanted is None:  # everything, but --quick leaves out the memory plot's extra points
        return [c for c in cases if not (args.quick and c.key in PLOT_ONLY_KEYS)], True
    keys, snapshot = expand(wanted)
    unknown = keys - {c.key for c in cases}
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; known: {[c.key for c in cases]} + mem, long, snapshot")
    return [c for c in cases if c.key in keys], snapshot


def run_cases(cases, factory, chosen, reps, timeout, quick) -> dict:
    """Every case's JSON, in order, with the memory cases' TTLs and tier knobs."""
    from tqdm import tqdm

    plan = [(c, [s for s in c.systems if s in chosen]) for c in cases]
    out: dict = {}
    with tqdm(total=sum(len(s) for _, s in plan) * reps, desc="bench_agents", unit="run") as bar:
        for case, systems in plan:
            out[case.key] = {**run_case(case, factory, systems, reps, bar, timeout), "quick": quick}
            if case.key in MEMORY_KEYS + LONG_KEYS:
                out[case.key].update(case_extras(out[case.key]))
    return out


def run_pipelined_tools(lm, latency: float, quick: bool) -> dict | None:
    """With --tool-latency > 0: one turn of several tool calls, pipelined vs not."""
    if latency <= 0:
        return None
    from bench.cases.pipelined_case import run_pipelined

    out_pipe = run_pipelined(lm, latency, reps=2 if quick else 5)
    for name in ("equal", "first_slowest"):
        p = out_pipe[name]
        print(f"pipelined tools ({name}, {len(p['calls'])} calls, up to {latency:g}s): turn "
              f"{p['turn_s_sequential']:.2f}s -> {p['turn_s_pipelined']:.2f}s (saved {p['saved_s']:.2f}s)")
    return out_pipe


def run_fast_forward(lm, fmt, cases, base, args) -> dict | None:
    """Grammar fast-forward on and off on the tool-call cases selected (bench/cases/ff_case.py)."""
    if args.no_ff or not {"bfcl", "agents8"} & {c.key for c in cases}:
        return None
    ff = run_ff(lm, ff_cases(cases, fmt, args.quick), base, 4 if args.quick else 6, kv_tokens)
    print_ff(ff)
    return ff


def report(out: dict, snapshot: dict | None) -> None:
    """Tables of this run's cases and the snapshot measurement."""
    for key, case in out.items():
        print_case(key, case)
        if key in MEMORY_KEYS + LONG_KEYS:
            print_memory(key, case)
    if snapshot is not None and snapshot.get("status") == "ok":
        print(f"snapshot/restore ({snapshot['prompt_tokens']} tokens, median of {snapshot['reps']}): prefill "
              f"{snapshot['prefill_s']:.2f}s, restore + 1 token {snapshot['restore_s']:.3f}s "
              f"-> {snapshot['speedup']:.1f}x")
    elif snapshot is not None:
        print("snapshot/restore:", snapshot.get("reason"))


def main() -> None:
    args = parse_args()
    if any(s.startswith("llamacpp") for s in args.systems.split(",")):
        ensure_llama_cpp(not args.no_install)
    reps = args.reps or (1 if args.quick else 3)
    chosen = ["agentrt"] + [s for s in args.systems.split(",") if s in SYSTEMS and s != "agentrt"]
    lm = load_model("smollm2-135m", quantize=args.quant)
    fmt = ChatFormat(lm.tokenizer)
    cases, with_snapshot = select_cases(args, fmt, lm.tokenizer)
    base = EngineConfig(response_cache_size=0, max_session_seqs=32, max_transient_seqs=32)
    factory = SystemFactory(lm, base, args.threads)
    t0 = time.perf_counter()
    out = run_cases(cases, factory, chosen, reps, args.run_timeout, args.quick)
    factory.close()
    snapshot = None
    if with_snapshot:
        from bench.cases.snapshot_case import run_snapshot

        snapshot = {**run_snapshot(lm, fmt, base, reps=2 if args.quick else 5), "quick": args.quick}
    out_pipe = run_pipelined_tools(lm, args.tool_latency, args.quick)
    ff = run_fast_forward(lm, fmt, cases, base, args)
    traced = None if args.no_trace else trace_case.run(lm, *((3, 2) if args.quick else (5, 4)))
    report(out, snapshot)
    if args.merge:
        out, snapshot, out_pipe = merge(load_previous(args.out, args.quick), out, snapshot, out_pipe)
    keys, reasons = headline(out, snapshot)
    if ff is not None:
        keys.update(ff_headline(ff))
    if traced is not None:
        keys["tracing_overhead_per_turn"] = traced["tracing_overhead_per_turn"]
        print(f"tracing: turn {traced['turn_s_tracing_off']:.3f}s off, {traced['turn_s_tracing_on']:.3f}s on "
              f"({traced['spans_per_turn']:.1f} spans a turn)")
    res = {**keys, "reasons": reasons, "headline_sources": headline_sources(out), "cases": out,
           "snapshot": snapshot, "pipelined_tools": out_pipe, "fast_forward": ff, "tracing": traced, "machine": machine(), "quick": args.quick,
           "reps": reps, "quantize": args.quant, "tool_latency_s": args.tool_latency,
           "tool_latency_dist": args.tool_latency_dist, "llama_cpp_threads": args.threads,
           "shared_prompts": not args.distinct_prompts, "bench_wall_s": time.perf_counter() - t0,
           "merged": args.merge, "notes": NOTES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps({**keys, "reasons": reasons}, indent=1))
    print("wrote", args.out, *plot(out, args.out.parent), *plot_memory(out, args.out.parent))


NOTES = ["ratios are peer / agentrt per repetition, then median (p90 in cases.*.ratios); > 1: agentrt faster",
         "hit_rate_gain_pp: agentrt KV hit rate minus the peer's (percentage points); ttft_reduction: "
         "1 - agentrt mean TTFT / the peer's; both per repetition, then median",
         "llama.cpp and agentrt (quantize=auto: native) compute on the GGUF's Q4_1/Q8_0 weights; "
         "transformers dequantizes to fp32",
         "response cache off (size 0): all work is fresh; outputs are force-decoded and checked",
         "with --merge, cases not run this time come from the previous file (each case records `quick`); "
         "bench_wall_s, machine and reps are this run's"]


if __name__ == "__main__":
    main()
