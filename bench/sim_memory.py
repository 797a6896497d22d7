"""bench_agents' memory cases, run for real and simulated (bench_sim.py, issue 28 part 5).

Each case (bench/cases/memory_cases.py: agents with a shared system prompt, a KV pool of a fraction of
their histories, tool latencies drawn per tool) runs through the same agentrt systems as
bench_agents (bench/peers/agentrt_peer.py: the KV hierarchy, the same without its tier, prefix
cache + LRU), once on the model and once on a simulated executor replaying the same scripts
(every call's output is known before the run: the ScriptBook holds them all) on a virtual clock.
Reported per case and system: simulated / measured for mean per-call latency, TTFT and hit rate,
and whether the systems rank the same by mean latency (pairs beyond 5% only)."""

from __future__ import annotations

import statistics

import anyio

from agentrt.sim import ScriptBook, SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from bench.cases.agents_cases import kv_tokens
from bench.cases.memory_cases import MEM_SYSTEMS, memory_cases
from bench.peers.agentrt_peer import AgentrtSystem
from bench.sim_compare import ranking

CASES_QUICK = ("mem8_p60", "mem8_p40")
METRICS = ("latency_s", "ttft_s", "hit_rate")
MAKERS = {"agentrt": AgentrtSystem.full, "agentrt_no_tier": AgentrtSystem.no_tier,
          "agentrt_prefix_lru": AgentrtSystem.prefix_lru}


def summarize(result) -> dict:
    recs = result.records
    return {"latency_s": statistics.fmean(r.total_s for r in recs), "ttft_s": statistics.fmean(r.ttft_s for r in recs),
            "hit_rate": result.extra.get("hit_rate"), "wall_s": result.wall_s,
            "exact": all(r.exact for r in recs), "calls": len(recs)}


def one_case(case, lm, base, costs: StepCosts) -> dict:
    scripts = case.make(0)
    cfg = base.replace(kv_cache_tokens=kv_tokens(scripts, case.pool_fraction))
    book = ScriptBook()
    for s in scripts:
        for c in s:
            book.record(c.prompt, c.output)
    out = {"title": case.title, "kv_cache_tokens": cfg.kv_cache_tokens, "systems": {}}
    for name in MEM_SYSTEMS:
        system = MAKERS[name](lm, cfg)
        anyio.run(system.warmup)
        real = summarize(anyio.run(system.run, scripts, case.arrival))
        model = SimModel(lm.model.cfg, lm.model.kv_dtype)
        sim = summarize(sim_run(system.run, scripts, case.arrival, SimExecutor(model, costs, book)))
        ratio = {m: sim[m] / real[m] if real[m] and sim[m] is not None else None for m in METRICS}
        out["systems"][name] = {"real": real, "sim": sim, "sim_over_real": ratio}
        print(f"{case.key} {name:20s} real {real['latency_s']:.2f} s/call  sim {sim['latency_s']:.2f}  "
              + " ".join(f"{m} {v:.2f}" for m, v in ratio.items() if v), flush=True)
    out.update(ranking(out["systems"], "latency_s"))
    return out


def memory_validation(lm, fmt, costs: StepCosts, base, quick: bool) -> dict:
    """The memory cases (quick: 8 agents at 60% and 40% pools) for real and simulated."""
    cases = [c for c in memory_cases(fmt, lm.tokenizer, quick=quick) if not quick or c.key in CASES_QUICK]
    return {c.key: one_case(c, lm, base, costs) for c in cases}
