"""Grammar fast-forward on bench_agents' tool-call cases (BFCL replay, the 8-agent case).

Each case's scripts are replayed on the full agentrt configuration (sessions, radix, speculation)
twice per repetition, fast-forward on and off (`EngineConfig.grammar_fast_forward`), in
alternating order. Every call runs under the real tool grammar of the tools its prompt declares
(tool_choice auto, the chat format's tool-call format), as an agent's call would: each step
computes the grammar's mask, and fast-forward jumps where the grammar forces text. The script's
own tokens are still forced (`ScriptedGrammar`), so both runs write the same output; a forced
jump is kept as far as it equals the script (the scripts are the tokenizer's encoding of the
rendered calls, so a jump that respells a boundary is cut there and counted).

Per tool call (a call whose output calls tools): decode steps (events that carried tokens, the
first one included), wall latency, the ids fast-forward supplied.

    python -m bench.cases.ff_case --quick   # alone: bench/results/fast_forward.json
    (bench_agents.py runs it too, after its cases: agents.json `fast_forward` and its keys)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from contextlib import aclosing

import anyio
import torch

from agentrt import Engine, EngineConfig, SamplingParams  # noqa: E402
from agentrt.errors import AgentrtError  # noqa: E402
from agentrt.prefixes import common_prefix  # noqa: E402
from bench.peers.agentrt_peer import ForcedTokens  # noqa: E402
from bench.peers.base import drive  # noqa: E402

CASES = ("bfcl", "agents8")


class ScriptedGrammar(ForcedTokens):
    """ForcedTokens (the script's next token forced) beside the tool grammar's constraint: its
    mask computed every step, its fast-forward offered to the engine. A script token the grammar
    refuses drops the grammar for the rest of the call (`refused`)."""

    def __init__(self, script: list[int], grammar) -> None:
        super().__init__(script)
        self.g = grammar
        self.kept = self.offered = self.cut = 0
        self.refused = False

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.g is not None and self.pos < len(self.script):
            self.g.mask_logits(logits.clone())  # the real per-step cost (logits kept for the script)
        return super().mask_logits(logits)

    def advance(self, token: int) -> None:
        super().advance(token)
        if self.g is not None:
            self.g.advance(token)
            if self.g.error is not None:
                self.g, self.refused = None, True

    def fast_forward(self, last: int | None, room: int) -> tuple[int, list[int]]:
        if self.g is None:
            return 0, []
        replaced, ids = self.g.fast_forward(last, room)
        if not ids:
            return 0, []
        self.offered += len(ids) - replaced
        k = common_prefix(list(ids), self.script[self.pos - replaced:])
        if replaced and k == 0:  # a respelled model token: not the script's; undo the jump
            self.g.rollback(len(ids))
            self.g.advance(last)
            self.cut += 1
            return 0, []
        if k < len(ids):
            self.g.rollback(len(ids) - k)
            self.cut += 1
        self.pos += k - replaced
        self.kept += k - replaced
        return replaced, ids[:k]


async def _call(eng: Engine, c, session, factory) -> dict:
    grammar = None
    if c.offered:
        try:
            grammar = factory.for_tools(list(c.offered), "auto")
        except AgentrtError:
            grammar = None
    con = ScriptedGrammar(c.output, grammar)
    t0 = anyio.current_time()
    first, steps, toks = None, 0, []
    stream = eng.generate(c.prompt, SamplingParams(max_tokens=len(c.output)), session=session,
                          tag=f"agent{c.agent}", constraint=con)
    async with aclosing(stream) as events:
        async for ev in events:
            if ev.token_ids:
                steps += 1
                first = first if first is not None else anyio.current_time()
            toks.extend(ev.token_ids)
    end = anyio.current_time()
    return {"agent": c.agent, "turn": c.turn, "tool_call": bool(c.tools), "grammar": grammar is not None,
            "refused": con.refused, "total_s": end - t0, "ttft_s": (first or end) - t0, "steps": steps,
            "output_tokens": len(c.output), "ff_kept": con.kept, "ff_offered": con.offered, "ff_cut": con.cut,
            "exact": toks == c.output}


async def run_scripts(lm, cfg: EngineConfig, scripts, arrival: str, factory) -> list[dict]:
    async with Engine(lm, cfg) as eng:
        sess = {s[0].agent: await eng.open_session(tag=f"agent{s[0].agent}") for s in scripts}
        records, _ = await drive(scripts, arrival, lambda c: _call(eng, c, sess[c.agent], factory))
        for s in sess.values():
            await s.close()
    return records


def ff_cases(cases, fmt, quick: bool) -> list:
    """bench_agents' agents8 case, and its BFCL replay with every turn of its entries (the quick
    BFCL case keeps only the first turn: cold prompts, whose prefill fast-forward cannot cut)."""
    import dataclasses

    from bench.cases.agents_cases import BFCL_FULL, BFCL_QUICK, _bfcl

    out = [c for c in cases if c.key == "agents8"]
    size = {**(BFCL_QUICK if quick else BFCL_FULL), "max_turns": 2 if quick else None}
    bfcl = next((c for c in cases if c.key == "bfcl"), None)
    if bfcl is None:
        return out
    title = f"BFCL v4 multi_turn_base, {size['n']} entries" + (f", first {size['max_turns']} turns" if quick else "")
    return out + [dataclasses.replace(bfcl, title=title, make=_bfcl(fmt, size["n"], size["max_turns"], size["pool"], 0.0))]


def summary(recs: list[dict]) -> dict:
    calls = [r for r in recs if r["tool_call"]]
    out_tokens = sum(r["output_tokens"] for r in calls)
    return {"tool_calls": len(calls), "calls": len(recs), "exact": all(r["exact"] for r in recs),
            "grammar_refused": sum(r["refused"] for r in calls),
            "steps_per_tool_call": sum(r["steps"] for r in calls) / max(len(calls), 1),
            "tool_call_latency_s": statistics.mean(r["total_s"] for r in calls) if calls else None,
            "call_latency_s": statistics.mean(r["total_s"] for r in recs),
            "tool_call_ttft_s": statistics.mean(r["ttft_s"] for r in calls) if calls else None,
            "tool_call_decode_s": statistics.mean(r["total_s"] - r["ttft_s"] for r in calls) if calls else None,
            "ff_forced_token_fraction": sum(r["ff_kept"] for r in calls) / max(out_tokens, 1),
            "ff_offered_fraction": sum(r["ff_offered"] for r in calls) / max(out_tokens, 1),
            "ff_cut": sum(r["ff_cut"] for r in calls)}


async def prepare(lm, cfg: EngineConfig, scripts, factory):
    """The grammar factory (made once), every tool set compiled and a short call through a
    throwaway engine, all before the clock runs."""
    from agentrt.conversation.engine_text import grammars_of

    async with Engine(lm, cfg.replace(kv_cache_tokens=4096)) as eng:
        factory = factory or grammars_of(eng)
        await eng.complete(list(range(100, 164)), SamplingParams(max_tokens=4, ignore_eos=True))
    for call in (c for s in scripts for c in s if c.offered):
        # a tool set the grammar cannot compile: that call runs without it (`grammar` false)
        with contextlib.suppress(AgentrtError):
            factory.for_tools(list(call.offered), "auto")
    return factory


def _reductions(on: dict, off: dict) -> dict:
    res = {"on": on, "off": off,
           "steps_reduction": 1 - on["steps_per_tool_call"] / off["steps_per_tool_call"],
           "call_latency_reduction": 1 - on["call_latency_s"] / off["call_latency_s"]}
    if on["tool_call_latency_s"]:
        res["tool_call_latency_reduction"] = 1 - on["tool_call_latency_s"] / off["tool_call_latency_s"]
        # after the first token: the part of a call fast-forward can shorten (the rest is prefill)
        res["tool_call_decode_reduction"] = 1 - on["tool_call_decode_s"] / off["tool_call_decode_s"]
    return res


def run_ff(lm, cases, base: EngineConfig, reps: int, kv_tokens) -> dict:
    """{case: per-rep on/off summaries and reductions} for the Case objects `cases`; fast-forward
    on and off alternate which runs first."""
    out: dict = {}
    factory = None
    for case in cases:
        per_rep = []
        for rep in range(reps):
            scripts = case.make(rep)
            cfg = base.replace(kv_cache_tokens=kv_tokens(scripts, case.pool_fraction))
            runs = {}
            for ff in ((True, False) if rep % 2 == 0 else (False, True)):
                c = cfg.replace(grammar_fast_forward=ff)

                async def go(c=c):
                    nonlocal factory
                    factory = await prepare(lm, c, scripts, factory)
                    return await run_scripts(lm, c, scripts, case.arrival, factory)
                runs[ff] = summary(anyio.run(go))
            per_rep.append(_reductions(runs[True], runs[False]))
        keys = ("steps_reduction", "tool_call_latency_reduction", "tool_call_decode_reduction",
                "call_latency_reduction")
        out[case.key] = {"title": case.title, "arrival": case.arrival, "per_rep": per_rep,
                         **{k: statistics.median(r[k] for r in per_rep) for k in keys
                            if all(k in r for r in per_rep)},
                         "ff_forced_token_fraction": statistics.median(
                             r["on"]["ff_forced_token_fraction"] for r in per_rep)}
    return out


def headline(ff: dict) -> dict:
    """The issue's keys from run_ff's result."""
    reps = [r for c in ff.values() for r in c["per_rep"]]
    on = sum(r["on"]["steps_per_tool_call"] * r["on"]["tool_calls"] for r in reps)
    off = sum(r["off"]["steps_per_tool_call"] * r["off"]["tool_calls"] for r in reps)
    calls = sum(r["on"]["tool_calls"] for r in reps)
    kept = sum(r["on"]["ff_forced_token_fraction"] * r["on"]["tool_calls"] for r in reps)
    return {"ff_decode_steps_reduction_toolcalls": 1 - on / off if off else None,
            "ff_turn_latency_reduction_bfcl": ff.get("bfcl", {}).get("tool_call_latency_reduction"),
            "ff_decode_latency_reduction_bfcl": ff.get("bfcl", {}).get("tool_call_decode_reduction"),
            "ff_forced_token_fraction": kept / calls if calls else None}


def print_ff(ff: dict) -> None:
    for key, c in ff.items():
        r = c["per_rep"][0]
        print(f"fast-forward, {c['title']}: steps per tool call {r['off']['steps_per_tool_call']:.1f} -> "
              f"{r['on']['steps_per_tool_call']:.1f} ({c['steps_reduction']:.0%} fewer, median); tool-call "
              f"latency -{c.get('tool_call_latency_reduction', float('nan')):.0%} (after the first token "
              f"-{c.get('tool_call_decode_reduction', float('nan')):.0%}); forced ids "
              f"{c['ff_forced_token_fraction']:.0%} of a call's; grammar refused "
              f"{r['on']['grammar_refused']} of {r['on']['tool_calls']} calls")


def main() -> None:
    from agentrt import load_model
    from agentrt.conversation.chat_format import ChatFormat
    from bench.cases.agents_cases import build_cases, kv_tokens
    from bench.common import RESULTS, machine

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=0)
    args = ap.parse_args()
    lm = load_model("smollm2-135m")
    fmt = ChatFormat(lm.tokenizer)
    cases = ff_cases(build_cases(fmt, lm.tokenizer, quick=args.quick), fmt, args.quick)
    base = EngineConfig(response_cache_size=0, max_session_seqs=32, max_transient_seqs=32)
    ff = run_ff(lm, cases, base, args.reps or 2, kv_tokens)
    print_ff(ff)
    res = {**headline(ff), "cases": ff, "machine": machine(), "quick": args.quick}
    path = RESULTS / "fast_forward.json"
    path.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    print(json.dumps(headline(ff), indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
