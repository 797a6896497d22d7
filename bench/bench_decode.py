"""Decode speed on tool-call outputs: speculation off vs on, fp32 vs native GGUF quantization
(Q4_1/Q8_0), batch 1 and 8.

The embedded SmolLM2 answers tool-calling prompts under the tool grammar (tool_choice
"required", greedy: what an agent does); speculation drafts from the prompt. Also this
machine's read bandwidth with the weight-read bound of one step, and llama-cpp-python's decode
on the same GGUF when installed (`pip install agentrt[bench]`), measured the fair way (fixed
input tokens, so no early stop at end of generation; prompt evaluation not timed; 2 threads). The response cache is off: all work is
fresh. Writes bench/results/decode.json.   python -m bench.bench_decode [--quick]
"""

from __future__ import annotations

import argparse
import time

from agentrt.config import EngineConfig  # noqa: E402
from agentrt.constrain.grammar import GrammarFactory  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from agentrt.engine.core import EngineCore  # noqa: E402
from agentrt.model.loaders.files import resolve_source  # noqa: E402
from agentrt.model.loaders.load import load_model  # noqa: E402
from agentrt.sampling import SamplingParams  # noqa: E402
from bench.common import decode_weight_bytes, machine, print_table, read_bandwidth, write_results  # noqa: E402
from bench.peers.forward_step import LlamaCppStep  # noqa: E402
from bench.peers.llamacpp_peer import llama_cpp_missing  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "search_flights", "description": "Search flights between two airports on a date.",
    "parameters": {"type": "object", "properties": {
        "origin": {"type": "string", "description": "IATA code of the departure airport"},
        "destination": {"type": "string", "description": "IATA code of the arrival airport"},
        "date": {"type": "string", "description": "departure date, YYYY-MM-DD"},
        "passengers": {"type": "integer"}}, "required": ["origin", "destination", "date"]}}}]
ASKS = ["Search flights from origin CDG to destination JFK on date 2026-12-24 for 2 passengers.",
        "Find flights: origin LHR, destination NRT, date 2027-01-15, passengers 1.",
        "I need search_flights with origin SFO and destination SEA on 2026-12-31, 3 passengers.",
        "search_flights origin=AMS destination=BCN date=2027-02-02 passengers=4",
        "Flights from MAD to LIS on 2027-03-10 for 1 passenger please.",
        "origin FRA, destination DXB, date 2027-04-01, 2 passengers: search flights.",
        "Please search flights origin SYD destination AKL date 2027-05-05 passengers 2.",
        "Look up flights from YYZ to ORD on 2027-06-20 for 5 passengers."]


def run(lm, prompts, spec: bool, factory) -> dict:
    cfg = EngineConfig(enable_speculation=spec, response_cache_size=0, spec_min_acceptance=0.0,
                       spec_token_budget=64)
    core = EngineCore(lm.model, cfg, eos_token_ids=lm.tokenizer.eos_token_ids)
    reqs = [core.add_request(p, SamplingParams(max_tokens=96), lambda e: None,
                             seq_id=core.pool.acquire("transient", 0),
                             constraint=factory.for_tools(TOOLS, "required")) for p in prompts]
    while any(not r.output for r in reqs):  # prefill, not timed
        core.step()
    t0, base = time.perf_counter(), sum(len(r.output) for r in reqs)
    while core.has_work():
        core.step()
    dt = time.perf_counter() - t0
    toks = sum(len(r.output) for r in reqs) - base
    st = core.stats()
    return {"tok_s": toks / dt, "tokens": toks, "acceptance": st.spec_acceptance,
            "outputs": [lm.tokenizer.decode(r.output) for r in reqs[:2]], "steps": st.steps}


def llama_cpp_decode(path: str, n: int) -> float | None:
    """tokens/s of llama-cpp-python decoding n tokens after a 128-token prompt (bench_model)."""
    if llama_cpp_missing() is not None:
        return None
    return 1.0 / LlamaCppStep(path).decode_round(1, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="batch 1 and 8 on fewer prompts")
    args = ap.parse_args()
    bw = read_bandwidth()
    res: dict = {"machine": machine(), "read_bytes_per_s": bw, "response_cache": "off"}
    rows = []
    for quant in ("none", "native"):
        lm = load_model("smollm2-135m", quantize=quant)
        fmt, factory = ChatFormat(lm.tokenizer), GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
        prompts = [fmt.encode([{"role": "user", "content": a}], tools=TOOLS) for a in ASKS]
        wbytes = decode_weight_bytes(lm.model)
        bound_ms = wbytes / bw * 1e3
        for batch in (1, 8):
            sets = [[p] for p in prompts[:2 if args.quick else 4]] if batch == 1 else [prompts]
            for spec in (False, True):
                runs = [run(lm, s, spec, factory) for s in sets]
                tok_s = sum(r["tok_s"] for r in runs) / len(runs)
                acc = sum(r["acceptance"] for r in runs) / len(runs)
                key = f"{quant}_b{batch}_{'spec' if spec else 'nospec'}"
                res[key] = {"tok_s": tok_s, "acceptance": acc, "sample_output": runs[0]["outputs"][0]}
                step_ms = batch / tok_s * 1e3 if not spec else None
                rows.append([quant, batch, "on" if spec else "off", tok_s, f"{acc:.0%}" if spec else "-",
                             f"{bound_ms / step_ms:.0%}" if step_ms else "-"])
                if not spec and batch == 1:
                    res[f"{quant}_decode_b1_bandwidth_fraction"] = bound_ms / step_ms
                    res[f"{quant}_weight_bytes"] = wbytes
    res["spec_speedup_toolcalls"] = res["none_b1_spec"]["tok_s"] / res["none_b1_nospec"]["tok_s"]
    res["spec_speedup_toolcalls_native"] = res["native_b1_spec"]["tok_s"] / res["native_b1_nospec"]["tok_s"]
    res["acceptance_rate"] = res["none_b1_spec"]["acceptance"]
    res["decode_b1_bandwidth_fraction"] = res["native_decode_b1_bandwidth_fraction"]
    res["native_speedup_b1"] = res["native_b1_nospec"]["tok_s"] / res["none_b1_nospec"]["tok_s"]
    lc = llama_cpp_decode(str(resolve_source("smollm2-135m")), 64)
    res["llama_cpp_b1_tok_s"] = lc if lc is not None else "not installed (pip install agentrt[bench])"
    print_table("decode on tool-call outputs (SmolLM2-135M, greedy, tool grammar)",
                ["weights", "batch", "speculation", "tok/s", "acceptance", "bandwidth bound reached"], rows)
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()
           if k in ("spec_speedup_toolcalls", "acceptance_rate", "decode_b1_bandwidth_fraction",
                    "native_speedup_b1", "llama_cpp_b1_tok_s")})
    print("wrote", write_results("decode", res))


if __name__ == "__main__":
    main()
