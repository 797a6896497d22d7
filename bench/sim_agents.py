"""The KV memory hierarchy at many agents with long contexts, through the simulator (issue 29,
part 5): bench_agents' long-context memory case (bench/cases/memory_cases.py: each agent its own long
anchor, tool results of hundreds of tokens, histories growing toward 8k, heavy-tailed tool
latencies) at `--agents` agents (default 256), KV pool at `--fraction` of their histories, on a
simulated engine priced by a cost model (default the H100 one in bench/costs/; `--costs` adds
others, e.g. a calibrated CPU model). Every call's output is known (the scripts), so the engine
is the real core -- scheduler, radix tree, eviction, tier, retention, return prefetch -- on a
virtual clock. The tier is host memory (`--tier-gb`).

Systems (bench/peers/agentrt_peer.py): agentrt (the hierarchy), agentrt_no_tier, and
agentrt_prefix_lru (radix + LRU, the vLLM/SGLang-like baseline). Writes
bench/results/sim_agents.json: per cost model the systems' figures and the ratios, and the
headline keys `sim_long_hit_rate_gain_pp_vs_lru`, `sim_long_ttft_reduction_vs_lru`,
`sim_long_per_turn_speedup_vs_prefix_lru`, `sim_prefetch_used_fraction` (first cost model).

    python -m bench.sim_agents [--quick] [--agents 256] [--fraction 0.6] [--costs a.json,b.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from agentrt import DEFAULT_MODEL, EngineConfig, load_model  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from agentrt.model.config import ModelConfig  # noqa: E402
from agentrt.sim import SimExecutor, SimModel, StepCosts  # noqa: E402
from agentrt.sim import run as sim_run  # noqa: E402
from bench.agents_report import ratios, summarize  # noqa: E402
from bench.cases.agents_cases import kv_tokens  # noqa: E402
from bench.cases.memory_cases import DEFAULT_DIST, LONG_FULL, LONG_QUICK, MEM_SYSTEMS, _make  # noqa: E402
from bench.common import machine, print_table, write_results  # noqa: E402
from bench.peers.agentrt_peer import AgentrtSystem  # noqa: E402
from bench.workloads.latency import LatencyDist  # noqa: E402

COSTS = Path(__file__).resolve().parent / "costs"
MAKERS = {"agentrt": AgentrtSystem.full, "agentrt_no_tier": AgentrtSystem.no_tier,
          "agentrt_prefix_lru": AgentrtSystem.prefix_lru}
BASELINE = "agentrt_prefix_lru"


def one_model(costs: StepCosts, scripts, kv: int, tier_bytes: int) -> dict:
    """Every system on the scripts, simulated with `costs`; figures and ratios against agentrt."""
    details = costs.details.get("model")
    model = SimModel(ModelConfig(**{**details, "rope_freq_factors": None})) if details else None
    if model is None:
        raise SystemExit(f"{costs.name}: the cost model names no model (details.model)")
    base = EngineConfig(kv_cache_tokens=kv, response_cache_size=0, max_session_seqs=len(scripts) + 8,
                        max_transient_seqs=max(64, len(scripts)), acquire_timeout=1e6)
    out: dict = {"cost_model": costs.name, "systems": {}}
    for name in MEM_SYSTEMS:
        system = MAKERS[name](model, base)
        if name == "agentrt":
            system.config = system.config.replace(kv_tier_bytes=tier_bytes)
        t0 = time.perf_counter()
        s = summarize(sim_run(system.run, scripts, "concurrent", SimExecutor(model, costs)))
        s["sim_wall_s"] = time.perf_counter() - t0
        out["systems"][name] = s
        c = s["counters"]
        print(f"{costs.name[:28]:28s} {name:20s} turn {s['mean_turn_ms'] / 1e3:.2f} s  ttft "
              f"{s['mean_ttft_ms'] / 1e3:.2f} s  hit {s['hit_rate']:.2f}  prefetched {c.get('prefetched_pages', 0)}"
              f" used {c.get('prefetch_used_pages', 0)}  ({s['sim_wall_s']:.0f} s)", flush=True)
    ref = out["systems"]["agentrt"]
    out["ratios"] = {n: ratios(ref, s) for n, s in out["systems"].items() if n != "agentrt"}
    c = ref["counters"]
    out["prefetch_used_fraction"] = c["prefetch_used_pages"] / c["prefetched_pages"] if c.get("prefetched_pages") else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the --quick long case's sizes (1.5k anchors, 8 turns)")
    ap.add_argument("--agents", type=int, default=256)
    ap.add_argument("--fraction", type=float, default=0.6, help="KV pool / the agents' final histories")
    ap.add_argument("--tier-gb", type=float, default=256.0, help="host memory for the KV tier (GiB)")
    ap.add_argument("--tool-latency-dist", default=DEFAULT_DIST)
    ap.add_argument("--costs", default=None, help="comma-separated cost models (default: bench/costs/gpu_*h100*)")
    a = ap.parse_args()
    paths = [Path(p) for p in a.costs.split(",")] if a.costs else sorted(COSTS.glob("gpu_*h100*.json"))
    tok = load_model(DEFAULT_MODEL).tokenizer  # (ids for the prompts; the weights are not run)
    spec = dataclasses.replace(LONG_QUICK if a.quick else LONG_FULL, agents=a.agents)
    t0 = time.perf_counter()
    scripts = _make(ChatFormat(tok), tok, spec, LatencyDist.parse(a.tool_latency_dist))(0)
    kv = kv_tokens(scripts, a.fraction)
    print(f"{a.agents} agents x {spec.turns} turns built in {time.perf_counter() - t0:.0f} s; KV pool {kv} tokens",
          flush=True)
    res: dict = {"machine": machine(), "quick": a.quick, "agents": a.agents, "turns": spec.turns,
                 "anchor_tokens": spec.anchor_tokens, "result_tokens": spec.result_tokens, "pool_fraction": a.fraction,
                 "kv_cache_tokens": kv, "tier_bytes": int(a.tier_gb * 2**30), "tool_latency": a.tool_latency_dist,
                 "models": {}}
    for path in paths:
        res["models"][path.stem] = one_model(StepCosts.load(path), scripts, kv, res["tier_bytes"])
    first = res["models"][paths[0].stem]
    r = first["ratios"][BASELINE]
    res.update({"sim_long_hit_rate_gain_pp_vs_lru": r["hit_rate_gain_pp"],
                "sim_long_ttft_reduction_vs_lru": r["ttft_reduction"],
                "sim_long_per_turn_speedup_vs_prefix_lru": r["per_turn_speedup"],
                "sim_prefetch_used_fraction": first["prefetch_used_fraction"]})
    rows = [[m, n, x["hit_rate_gain_pp"], x["ttft_reduction"], x["per_turn_speedup"]]
            for m, v in res["models"].items() for n, x in v["ratios"].items()]
    print_table(f"the hierarchy vs each system, simulated ({a.agents} agents)",
                ["cost model", "vs", "hit rate gain (pp)", "TTFT reduction", "per-turn speedup"], rows)
    print("wrote", write_results("sim_agents", res))


if __name__ == "__main__":
    main()
