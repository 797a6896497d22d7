"""Return prefetch where the pool has headroom (issue 60, "prefetch that holds"): the same
agents' workload with the return prefetch on and off, in one run, repetition by repetition.

Several agents on the embedded model, each with its own long anchor (instructions and tool
schemas), short tool results and heavy-tailed tool latencies: while an agent's tools run, the
other agents' turns cut its history to the host KV tier; when its tools are due (their early
quantile), the return prefetch copies it back in the loop's slack and holds it
(kv/memory.py: HELD) until the result arrives. With the prefetch off, the next turn's admission
copies it back on the critical path. The KV pool is a fraction of the agents' histories, so
the tools' waits are where the pressure cuts and the loop's slack is where room comes back.

Measured per repetition (same scripts and tool latencies for both settings; the order of the
two alternates): `prefetch_used_fraction` and `prefetched_pages` (the return prefetch's own
counts beside them), and the time to first token of every call after a tool result, with its
profile (queue wait, admission copies, prefill, tokens computed). Writes
bench/results/agents_prefetch.json.

    python -m bench.bench_prefetch [--reps 3] [--agents 6] [--turns 6] [--anchor 4800] [--pool 0.5]
                                   [--stagger 6] [--tool-latency-dist lognormal:3:0.7] [--out PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from contextlib import aclosing
from pathlib import Path

import anyio

from agentrt import DEFAULT_MODEL, Engine, EngineConfig, SamplingParams, load_model
from agentrt.conversation.chat_format import ChatFormat
from bench.cases.agents_cases import kv_tokens
from bench.common import RESULTS, machine
from bench.peers.agentrt_peer import TIER_COUNTERS, ForcedTokens
from bench.peers.base import drive
from bench.workloads.latency import LatencyDist, latency_stats, with_tool_latency
from bench.workloads.synthetic_agents import SyntheticSpec, synthetic_scripts

# long own anchors, short tool results and calls: a turn after a tool computes a few dozen tokens
# over a ~5k history, so what its admission copies back from the tier is a visible part of its TTFT
SPEC = SyntheticSpec(agents=6, turns=6, anchor_tokens=4800, user_tokens=60, result_tokens=(8, 24),
                     n_tools=8, max_args=0, shared_system=False)
DIST = "lognormal:3:0.7"  # per tool (0.5-2x scale): median 3 s, p90 ~7.4 s before the scale
POOL = 0.5  # KV pool / the agents' final histories
STAGGER_S = 6.0  # agent i starts i * STAGGER_S in: one long first prefill at a time, tools overlapping
TIER_BYTES = 4 << 30
LATENCY_SEED = 60_000
GOALS = {"used_fraction": 0.8, "pages": 50, "ttft_reduction": 0.20}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--agents", type=int, default=SPEC.agents)
    ap.add_argument("--turns", type=int, default=SPEC.turns)
    ap.add_argument("--anchor", type=int, default=SPEC.anchor_tokens, help="tokens of each agent's own anchor")
    ap.add_argument("--pool", type=float, default=POOL, help="KV pool / the agents' final histories")
    ap.add_argument("--stagger", type=float, default=STAGGER_S, help="seconds between the agents' starts")
    ap.add_argument("--tool-latency-dist", default=DIST, help="lognormal:MEDIAN:SIGMA | uniform:LO:HI | const:S")
    ap.add_argument("--out", type=Path, default=RESULTS / "agents_prefetch.json")
    return ap.parse_args()


async def call(eng: Engine, c, session) -> dict:
    """One scripted call, force-decoded: its TTFT and the engine's account of it (Usage)."""
    t0, first, toks, usage = time.perf_counter(), None, [], None
    stream = eng.generate(c.prompt, SamplingParams(max_tokens=len(c.output)), session=session,
                          tag=f"agent{c.agent}", constraint=ForcedTokens(c.output))
    async with aclosing(stream) as events:
        async for ev in events:
            if ev.token_ids and first is None:
                first = time.perf_counter()
            toks.extend(ev.token_ids)
            usage = ev.usage or usage
    end = time.perf_counter()
    return {"agent": c.agent, "turn": c.turn, "ttft_s": (first or end) - t0, "total_s": end - t0,
            "exact": toks == c.output, "prompt": len(c.prompt), "computed": usage.computed_prompt_tokens,
            "queue_s": usage.queue_wait_s, "promoted": usage.promoted_tokens, "promote_s": usage.promote_s,
            "prefill_s": usage.prefill_s}


async def run_once(lm, cfg: EngineConfig, scripts) -> dict:
    """The scripts on a fresh engine: agents as concurrent tasks, each telling the engine the
    tools it waits on after every call but its last."""
    async with Engine(lm, cfg) as eng:
        sess = {s[0].agent: await eng.open_session(tag=f"agent{s[0].agent}") for s in scripts}
        last = {s[-1].agent: s[-1].turn for s in scripts}

        async def one(c):
            rec = await call(eng, c, sess[c.agent])
            if c.turn < last[c.agent]:
                await sess[c.agent].expect_tools(list(c.tools) or ["tool"])
            return rec

        records, wall = await drive(scripts, "concurrent", one)
        st = eng.stats()
        counters = {k: getattr(st, k) for k in TIER_COUNTERS if k != "tool_ttls"}
        counters.update(preemptions=st.preemptions, hit_rate=st.hit_rate, steps=st.steps)
        for s in sess.values():
            await s.close()
    return {"records": records, "wall_s": wall, "counters": counters}


def profile(records: list[dict]) -> dict:
    """The calls after a tool result: TTFT (mean, median, p90, ms) and where it went."""
    after = [r for r in records if r["turn"] > 0]
    ttft = sorted(1000 * r["ttft_s"] for r in after)

    def mean(key, scale=1000.0):
        return scale * statistics.fmean(r[key] for r in after)

    return {"calls": len(after), "first_calls_queue_wait_mean_ms": 1000 * statistics.fmean(
                r["queue_s"] for r in records if r["turn"] == 0), "ttft_mean_ms": statistics.fmean(ttft), "ttft_median_ms": statistics.median(ttft),
            "ttft_p90_ms": ttft[int(0.9 * (len(ttft) - 1))], "queue_wait_mean_ms": mean("queue_s"),
            "prefill_mean_ms": mean("prefill_s"), "promote_copy_mean_ms": mean("promote_s"),
            "promoted_tokens_mean": mean("promoted", 1.0), "computed_tokens_mean": mean("computed", 1.0),
            "calls_with_promotion": sum(r["promoted"] > 0 for r in after),
            "calls_recomputing_over_100": sum(r["computed"] > 100 for r in after),
            "exact": all(r["exact"] for r in records)}


def run_rep(lm, fmt, args, rep: int, spec: SyntheticSpec, dist: LatencyDist) -> dict:
    """One repetition: the same scripts with the return prefetch on and off (order alternating)."""
    scripts = with_tool_latency(synthetic_scripts(fmt, lm.tokenizer, dataclasses.replace(spec, seed=spec.seed + rep)),
                                dist, LATENCY_SEED + rep)
    scripts = [[dataclasses.replace(s[0], tool_latency_s=i * args.stagger), *s[1:]] for i, s in enumerate(scripts)]
    base = EngineConfig(response_cache_size=0, max_session_seqs=32, max_transient_seqs=32, kv_tier_bytes=TIER_BYTES,
                        kv_cache_tokens=kv_tokens(scripts, args.pool))
    out = {"workload": {**latency_stats(scripts), "kv_cache_tokens": base.kv_cache_tokens,
                        "final_history_tokens": [len(s[-1].prompt) + len(s[-1].output) for s in scripts]}}
    for on in ((True, False) if rep % 2 == 0 else (False, True)):
        res = anyio.run(run_once, lm, base.replace(enable_return_prefetch=on), scripts)
        out["on" if on else "off"] = {"counters": res["counters"], "wall_s": res["wall_s"], **profile(res["records"])}
        print(f"rep {rep + 1} prefetch {'on ' if on else 'off'}: TTFT after a tool {out['on' if on else 'off']['ttft_mean_ms']:.0f} ms"
              f" mean; prefetched {res['counters']['prefetched_pages']} pages, used "
              f"{res['counters']['prefetch_used_fraction']:.2f}", flush=True)
    out["ttft_reduction"] = 1 - out["on"]["ttft_mean_ms"] / out["off"]["ttft_mean_ms"]
    return out


def summarize(reps: list[dict]) -> dict:
    """Per-run figures, their minimum / median, and the issue's goals met or not."""
    on = [r["on"]["counters"] for r in reps]
    used = [c["prefetch_used_fraction"] for c in on]
    pages = [c["prefetched_pages"] for c in on]
    cut = [r["ttft_reduction"] for r in reps]
    keys = {"prefetch_used_fraction": used, "prefetch_used_fraction_min": min(used), "prefetched_pages": pages,
            "return_prefetched_pages": [c["return_prefetched_pages"] for c in on],
            "return_prefetch_used_pages": [c["return_prefetch_used_pages"] for c in on],
            "ttft_after_tool_ms_on": [r["on"]["ttft_mean_ms"] for r in reps],
            "ttft_after_tool_ms_off": [r["off"]["ttft_mean_ms"] for r in reps],
            "ttft_reduction": cut, "ttft_reduction_median": statistics.median(cut), "ttft_reduction_min": min(cut)}
    keys["goal_used_fraction_met"] = all(u >= GOALS["used_fraction"] and p >= GOALS["pages"] for u, p in zip(used, pages))
    keys["goal_ttft_met"] = keys["ttft_reduction_median"] >= GOALS["ttft_reduction"]
    return keys


def main() -> None:
    args = parse_args()
    spec = dataclasses.replace(SPEC, agents=args.agents, turns=args.turns, anchor_tokens=args.anchor)
    dist = LatencyDist.parse(args.tool_latency_dist)
    lm = load_model(DEFAULT_MODEL)
    fmt = ChatFormat(lm.tokenizer)
    t0 = time.perf_counter()
    anyio.run(_warmup, lm)
    reps = [run_rep(lm, fmt, args, rep, spec, dist) for rep in range(args.reps)]
    keys = summarize(reps)
    res = {**keys, "goals": GOALS, "reps": reps, "spec": dataclasses.asdict(spec), "tool_latency_dist": str(dist),
           "pool_fraction": args.pool, "model": DEFAULT_MODEL, "machine": machine(),
           "bench_wall_s": time.perf_counter() - t0, "notes": NOTES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps(keys, indent=1))
    print("wrote", args.out)


async def _warmup(lm) -> None:
    """One short call through a throwaway engine (first-call allocations off the clock)."""
    async with Engine(lm, EngineConfig(kv_cache_tokens=4096)) as eng:
        await eng.complete(list(range(100, 164)), SamplingParams(max_tokens=4, ignore_eos=True))


NOTES = ["on / off: EngineConfig.enable_return_prefetch; the predictive prefetch (enable_prefetch) is on in both",
         "prefetched_pages and prefetch_used_fraction count every prefetch (return and predicted); "
         "return_prefetch_* the return prefetch's own",
         "ttft_after_tool: submission to first token of every call after a tool result (turn > 0), mean per run; "
         "ttft_reduction = 1 - on / off, per repetition",
         "profile per setting: queue wait, the admission's tier copies (promote_copy, estimated from the tier's "
         "measured cost per page), prefill (admission to first token), tokens computed"]


if __name__ == "__main__":
    main()
