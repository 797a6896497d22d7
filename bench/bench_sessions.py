"""Stateful sessions vs stateless: A agents x T turns on the embedded SmolLM2, one run.

agentrt stateful (sessions + radix) against the same engine with session reuse and the radix
cache off (stateless: every turn prefills the whole conversation). Agents run concurrently,
each turn after the previous one; generated lengths are forced (ignore_eos) so both systems do
identical decode work. Repeated, ratios computed per repetition then summarised (median).
Writes bench/results/sessions.json.   python -m bench.bench_sessions [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio

from agentrt import Engine, EngineConfig, SamplingParams, load_model  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from bench.common import machine, print_table, write_results  # noqa: E402
from bench.workloads.agentic import make_workflow  # noqa: E402


async def run_system(lm, fmt, workflows, cfg: EngineConfig, stateful: bool) -> dict:
    """Run every agent's workflow concurrently; per-turn latencies [agent][turn] and wall time."""
    lat = [[0.0] * len(w.turns) for w in workflows]
    maxlen = [0]
    async with Engine(lm, cfg) as eng:
        async def agent(i, wf):
            async with await eng.open_session(tag=f"agent{i}") as s:
                hist = list(wf.anchor)
                for t, (delta, n_gen) in enumerate(wf.turns):
                    hist += delta
                    sp = SamplingParams(max_tokens=n_gen, ignore_eos=True)
                    t0 = time.perf_counter()
                    out = await eng.complete(hist, sp, session=s if stateful else None)
                    lat[i][t] = time.perf_counter() - t0
                    maxlen[0] = max(maxlen[0], len(hist))
                    hist += fmt.encode_assistant_tokens(out.token_ids)
        t0 = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i, wf in enumerate(workflows):
                tg.start_soon(agent, i, wf)
        wall = time.perf_counter() - t0
        st = eng.stats()
    return {"turn_latency": lat, "wall": wall, "prompt_submitted": st.prompt_submitted,
            "prompt_computed": st.prompt_computed, "hit_rate": st.hit_rate, "max_prompt": maxlen[0],
            "response_cache_hits": st.response_cache_hits}


def per_turn_means(lat: list[list[float]]) -> list[float]:
    return [statistics.mean(col) for col in zip(*lat)]


def workload(lm, fmt, agents: int, turns: int, quick: bool, seed: int):
    long = turns > 6
    new = (100, 150) if long else (150, 300)
    gen = (30, 60)
    anchor = 1000
    if quick and long:  # a shorter 35-turn conversation so --quick finishes in minutes
        new, gen, anchor = (25, 40), (8, 16), 400
    return [make_workflow(fmt, lm.tokenizer, seed=seed * 100 + a, turns=turns, anchor_tokens=anchor,
                          new_tokens=new, gen_tokens=gen) for a in range(agents)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2 agents, 1 repetition, shorter 35-turn run")
    ap.add_argument("--agents", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--quant", default="auto", choices=["auto", "native", "none", "int8"],
                    help="weights of both systems (auto = the GGUF's own Q4_1/Q8_0; see model/quant.py)")
    args = ap.parse_args()
    agents = args.agents or (2 if args.quick else 4)
    reps = args.reps or (1 if args.quick else 3)
    lm = load_model("smollm2-135m", quantize=args.quant)
    fmt = ChatFormat(lm.tokenizer)
    base = EngineConfig(kv_cache_tokens=65536, max_session_seqs=32, response_cache_size=0)
    res: dict = {"machine": machine(), "agents": agents, "reps": reps, "quick": args.quick,
                 "quantize": args.quant,
                 "response_cache": "off (size 0) in both systems: all work is fresh"}
    for turns in (6, 35):
        speedups, medians, e2e, tables = [], [], [], []
        for rep in range(reps):
            n_agents = 1 if args.quick and turns > 6 else agents  # CPU prefill is slow here
            wfs = workload(lm, fmt, n_agents, turns, args.quick, seed=rep + 1)
            sf = anyio.run(run_system, lm, fmt, wfs, base, True)
            sl = anyio.run(run_system, lm, fmt, wfs, base.stateless(), False)
            a, b = per_turn_means(sf["turn_latency"]), per_turn_means(sl["turn_latency"])
            ratios = [y / x for x, y in zip(a, b)]
            speedups.append(statistics.mean(b) / statistics.mean(a))
            medians.append(statistics.median(ratios))
            e2e.append(sf["wall"] / sl["wall"])
            tables.append((a, b, sf, sl))
        a, b, sf, sl = tables[-1]
        rows = [[t + 1, x * 1e3, y * 1e3, y / x] for t, (x, y) in enumerate(zip(a, b))]
        print_table(f"{n_agents} agents x {turns} turns: per-turn latency (ms, mean over agents, last rep)",
                    ["turn", "stateful", "stateless", "speedup"], rows)
        res[f"turns{turns}"] = {
            "per_turn_speedup": statistics.median(speedups), "median_turn_speedup": statistics.median(medians),
            "e2e_ratio": statistics.median(e2e), "per_rep_speedup": speedups,
            "stateful_turn_ms": [x * 1e3 for x in a], "stateless_turn_ms": [y * 1e3 for y in b],
            "stateful_wall_s": sf["wall"], "stateless_wall_s": sl["wall"],
            "prefill_computed_over_submitted": {"stateful": sf["prompt_computed"] / sf["prompt_submitted"],
                                                "stateless": sl["prompt_computed"] / sl["prompt_submitted"]},
            "max_prompt_tokens": sf["max_prompt"], "agents": n_agents,
        }
    res["per_turn_speedup_6turn"] = res["turns6"]["per_turn_speedup"]
    res["median_turn_speedup_35turn"] = res["turns35"]["median_turn_speedup"]
    res["e2e_ratio_35turn"] = res["turns35"]["e2e_ratio"]
    print({k: round(v, 3) for k, v in res.items() if isinstance(v, float)})
    print("wrote", write_results("sessions", res))


if __name__ == "__main__":
    main()
