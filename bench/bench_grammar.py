"""Grammar backends for constrained tool calls: xgrammar vs llguidance on the same language.

For the embedded SmolLM2 tokenizer and six tools (nested objects, enums, arrays, required
fields), each backend compiles "Hermes tool calls of these tools" (tool_choice "required",
parallel calls; agentrt.toolcall.grammar_backends) and a valid output of one call per tool is
forced through: per token, the mask computation (fill the bitmask), then accepting the token.
Reported: mask us/token (median, p90), accept us/token, compile ms (median of fresh compiles),
the one-off tokenizer setup, and the same mask figures for tool_choice "auto" (free text, then
a call). Applying a bitmask to the logits is backend-independent (apply_bitmask) and reported
once. Fast-forward (`ff_*`): the same outputs walked through the engine's constraint
(GrammarFactory, xgrammar) as the model would write them, once token by token and once with
fast-forward (bench/cases/ff_case.py's ScriptedGrammar: jumps kept as far as they equal the output's
ids): model steps per call, and grammar time (mask + apply + jump) per step and per call.
Writes bench/results/grammar.json.   python -m bench.bench_grammar [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agentrt.constrain.grammar import BACKENDS  # noqa: E402
from agentrt.constrain.grammar_backends import CALL_SEP, CallSpec, GrammarSpec, schema_json  # noqa: E402
from agentrt.constrain.masks import apply_bitmask, bitmask_words  # noqa: E402
from agentrt.model.loaders.files import resolve_source  # noqa: E402
from agentrt.model.loaders.gguf import load_gguf_tokenizer  # noqa: E402
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG  # noqa: E402
from bench.common import machine, write_results  # noqa: E402


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


STR, INT = {"type": "string"}, {"type": "integer"}
TOOLS = {
    "get_weather": _obj({"city": STR, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    "search_web": _obj({"query": STR, "max_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
    "book_flight": _obj({
        "origin": STR, "destination": STR,
        "passengers": {"type": "array", "items": _obj({"name": STR, "age": INT}, ["name"]), "minItems": 1},
        "cabin": {"type": "string", "enum": ["economy", "business", "first"]}}, ["origin", "destination", "passengers"]),
    "send_email": _obj({"to": {"type": "array", "items": STR}, "subject": STR, "body": STR,
                        "urgent": {"type": "boolean"}}, ["to", "subject", "body"]),
    "create_event": _obj({"title": STR, "when": _obj({"date": STR, "hour": INT}, ["date"]),
                          "attendees": {"type": "array", "items": STR},
                          "reminder": {"type": ["integer", "null"]}}, ["title", "when"]),
    "calculator": _obj({"expression": STR, "precision": {"type": "number"}}, ["expression"]),
}
CALLS = [
    ("get_weather", {"city": "Paris", "unit": "celsius"}),
    ("search_web", {"query": "cheapest flights from Paris to New York in May", "max_results": 5}),
    ("book_flight", {"origin": "Paris", "destination": "New York", "passengers": [
        {"name": "Ann Smith", "age": 31}, {"name": "Bob Smith", "age": 33}, {"name": "Cleo"}], "cabin": "business"}),
    ("send_email", {"to": ["ann@example.com", "bob@example.com"], "subject": "Trip to New York",
                    "body": "Hi both,\nthe flights are booked: AF 006 on May 3rd, business class.\nCheers",
                    "urgent": False}),
    ("create_event", {"title": "Flight AF 006", "when": {"date": "2025-05-03", "hour": 10},
                      "attendees": ["Ann", "Bob", "Cleo"], "reminder": 60}),
    ("calculator", {"expression": "3 * (1250.40 + 89.99) - 150", "precision": 0.01}),
]
PREAMBLE = "Sure, I will look that up for you first and then book everything. "


def spec(free_text: bool) -> GrammarSpec:
    calls = tuple(CallSpec(name, schema_json(params)) for name, params in TOOLS.items())
    return GrammarSpec("calls", calls, free_text=free_text, parallel=True)


def output_text(free_text: bool) -> str:
    blocks = [OPEN_TAG + json.dumps({"name": n, "arguments": a}) + CLOSE_TAG for n, a in CALLS]
    return (PREAMBLE if free_text else "") + CALL_SEP.join(blocks)


def force(backend, compiled, ids: list[int], width: int) -> tuple[list[float], list[float]]:
    """Per token: seconds to compute the mask, seconds to accept the token."""
    m = backend.matcher(compiled)
    bitmask = torch.full((1, bitmask_words(width)), -1, dtype=torch.int32)
    fills, accepts = [], []
    for t in ids:
        t0 = time.perf_counter()
        m.fill(bitmask)
        t1 = time.perf_counter()
        if not (int(bitmask[0, t // 32]) >> (t % 32)) & 1:
            raise RuntimeError(f"{backend.name} masks token {t} of a valid output")
        t2 = time.perf_counter()
        if not m.accept(t):
            raise RuntimeError(f"{backend.name} rejects token {t} of a valid output")
        accepts.append(time.perf_counter() - t2)
        fills.append(t1 - t0)
    if not m.is_terminated():
        raise RuntimeError(f"{backend.name} did not terminate after the eos")
    return fills, accepts


def us(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return 1e6 * xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(name: str, tok, passes: int, compiles: int) -> dict:
    t0 = time.perf_counter()
    backend = BACKENDS[name](tok, tok.vocab_size)
    setup_ms = 1e3 * (time.perf_counter() - t0)
    res = {f"{name}_tokenizer_setup_ms": setup_ms}
    for free_text, mode in ((False, ""), (True, "auto_")):
        times = []
        for _ in range(compiles):
            t0 = time.perf_counter()
            compiled = backend.compile(spec(free_text))
            times.append(time.perf_counter() - t0)
        ids = tok.encode(output_text(free_text)) + [tok.eos_token_ids[0]]
        fills, accepts = [], []
        for _ in range(passes):
            f, a = force(backend, compiled, ids, tok.vocab_size)
            fills += f
            accepts += a
        res |= {f"{name}_{mode}mask_us_median": us(fills, 0.5), f"{name}_{mode}mask_us_p90": us(fills, 0.9),
                f"{name}_{mode}accept_us_median": us(accepts, 0.5),
                f"{name}_{mode}compile_ms": 1e3 * statistics.median(times), f"{mode}tokens": len(ids)}
    return res


def ff_walk(factory, ids: list[int], choice: str, ff: bool) -> dict:
    """Steps the model takes for output `ids` under the tools grammar, and the grammar's time."""
    from bench.cases.ff_case import ScriptedGrammar

    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in TOOLS.items()]
    con = ScriptedGrammar(ids, factory.for_tools(tools, choice))
    row = torch.zeros(factory.vocab_size)
    steps, mask_s, jump_s = 0, 0.0, 0.0
    t0 = time.perf_counter()
    if ff:
        con.fast_forward(None, len(ids))
    jump_s += time.perf_counter() - t0
    while not con.is_terminated():
        t0 = time.perf_counter()
        con.mask_logits(row)
        t1 = time.perf_counter()
        t = ids[con.pos]
        con.advance(t)
        steps += 1
        if ff and not con.is_terminated():
            con.fast_forward(t, len(ids) - con.pos)
        jump_s += time.perf_counter() - t1
        mask_s += t1 - t0
        row.zero_()
    if con.refused:
        raise RuntimeError("the tools grammar refused the output")
    return {"steps": steps, "mask_s": mask_s, "jump_s": jump_s, "forced": con.kept, "cut": con.cut}


def measure_ff(tok) -> dict:
    """Fast-forward at the grammar level on the six-call output (required and auto)."""
    from agentrt.constrain.grammar import GrammarFactory

    factory = GrammarFactory(tok, tok.vocab_size)
    res: dict = {}
    for free_text, mode in ((False, "required"), (True, "auto")):
        ids = tok.encode(output_text(free_text)) + [tok.eos_token_ids[0]]
        ff_walk(factory, ids, mode, True)  # compile and warm
        off, on = ff_walk(factory, ids, mode, False), ff_walk(factory, ids, mode, True)
        n = len(CALLS)
        res[f"ff_{mode}"] = {"tokens": len(ids), "steps_per_call_off": off["steps"] / n,
                             "steps_per_call_on": on["steps"] / n, "forced_ids": on["forced"], "cut": on["cut"],
                             "grammar_us_per_step_off": 1e6 * (off["mask_s"] + off["jump_s"]) / off["steps"],
                             "grammar_us_per_step_on": 1e6 * (on["mask_s"] + on["jump_s"]) / on["steps"],
                             "grammar_us_per_call_off": 1e6 * (off["mask_s"] + off["jump_s"]) / n,
                             "grammar_us_per_call_on": 1e6 * (on["mask_s"] + on["jump_s"]) / n,
                             "jump_us_per_step_on": 1e6 * on["jump_s"] / on["steps"]}
    req = res["ff_required"]
    res["ff_grammar_decode_steps_reduction"] = 1 - req["steps_per_call_on"] / req["steps_per_call_off"]
    res["ff_grammar_forced_token_fraction"] = req["forced_ids"] / req["tokens"]
    return res


def apply_us(width: int, repeat: int, native: bool = True, random: bool = False) -> float:
    """Median us to apply a mixed bitmask (alternate bits, or random words; an all-ones mask is
    skipped), by the compiled kernel or (native=False) the numpy/torch fallback."""
    import os

    logits, bitmask = torch.randn(width), torch.full((1, bitmask_words(width)), 0x55555555, dtype=torch.int32)
    if random:
        bitmask = torch.randint(-2 ** 31, 2 ** 31 - 1, bitmask.shape, dtype=torch.int32)
    old = os.environ.get("AGENTRT_NATIVE")
    os.environ["AGENTRT_NATIVE"] = "1" if native else "0"
    try:
        return _apply_times(logits, bitmask, repeat)
    finally:
        os.environ.pop("AGENTRT_NATIVE") if old is None else os.environ.__setitem__("AGENTRT_NATIVE", old)


def _apply_times(logits: torch.Tensor, bitmask: torch.Tensor, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        row = logits.clone()
        t0 = time.perf_counter()
        apply_bitmask(row, bitmask)
        times.append(time.perf_counter() - t0)
    return us(times, 0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one pass, three compiles (about a minute)")
    args = ap.parse_args()
    passes, compiles = (1, 3) if args.quick else (5, 10)
    tok = load_gguf_tokenizer(resolve_source("smollm2-135m"))
    res = {"machine": machine(), "vocab_size": tok.vocab_size, "tools": len(TOOLS), "passes": passes}
    for name in ("xgrammar", "llguidance"):
        res |= measure(name, tok, passes, compiles)
    res["apply_bitmask_us_median"] = apply_us(tok.vocab_size, 200)
    res["apply_bitmask_us_median_random_mask"] = apply_us(tok.vocab_size, 200, random=True)
    res["apply_bitmask_us_median_torch_fallback"] = apply_us(tok.vocab_size, 200, native=False)
    res["apply_bitmask_us_median_torch_fallback_random_mask"] = apply_us(tok.vocab_size, 200, native=False, random=True)
    # per-token cost decides (compiles are cached per tool set); a tie goes to xgrammar, whose
    # matcher rolls back natively and whose eos handling needs no bookkeeping
    res |= measure_ff(tok)
    x, g = res["xgrammar_mask_us_median"], res["llguidance_mask_us_median"]
    res["chosen"] = "llguidance" if g < 0.9 * x else "xgrammar"
    print(f"grammar backends: SmolLM2 vocab {tok.vocab_size}, {len(TOOLS)} tools, {res['tokens']} forced tokens "
          f"(required) / {res['auto_tokens']} (auto) x {passes} pass(es); us per token, ms per compile")
    cols = ("mask_us_median", "mask_us_p90", "accept_us_median", "compile_ms", "auto_mask_us_median",
            "auto_mask_us_p90", "auto_compile_ms", "tokenizer_setup_ms")
    print(f"{'backend':<11}" + "".join(f"{c:>20}" for c in cols))
    for name in ("xgrammar", "llguidance"):
        print(f"{name:<11}" + "".join(f"{res[f'{name}_{c}']:>20.1f}" for c in cols))
    print(f"apply_bitmask to a [{tok.vocab_size}] fp32 row: {res['apply_bitmask_us_median']:.1f} us "
          f"({res['apply_bitmask_us_median_random_mask']:.1f} random mask; torch fallback "
          f"{res['apply_bitmask_us_median_torch_fallback']:.1f} / "
          f"{res['apply_bitmask_us_median_torch_fallback_random_mask']:.1f}); chosen: {res['chosen']}")
    for mode in ("required", "auto"):
        f = res[f"ff_{mode}"]
        print(f"fast-forward ({mode}, {len(CALLS)} calls, {f['tokens']} ids): model steps per call "
              f"{f['steps_per_call_off']:.1f} -> {f['steps_per_call_on']:.1f}; grammar us per step "
              f"{f['grammar_us_per_step_off']:.1f} -> {f['grammar_us_per_step_on']:.1f} (jumps "
              f"{f['jump_us_per_step_on']:.1f}); per call {f['grammar_us_per_call_off']:.0f} -> "
              f"{f['grammar_us_per_call_on']:.0f} us; {f['forced_ids']} ids forced, {f['cut']} jumps cut")
    print("wrote", write_results("grammar", res))


if __name__ == "__main__":
    main()
