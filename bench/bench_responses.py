"""Multi-turn conversations through `agentrt serve`'s three ways to continue one, side by side:

  * responses_chain: `/v1/responses` with `previous_response_id` (each turn sends only its new
    message; the server continues the chain's KV session);
  * chat_prompt_cache_key: `/v1/chat/completions` resending the whole history under the
    conversation's `prompt_cache_key` (the server's routed session);
  * chat_resend: `/v1/chat/completions` resending the whole history with no key (transient
    requests; only the radix prefix cache helps);
  * llamacpp_server: `python -m llama_cpp.server` on the same GGUF, resending the history, when
    llama-cpp-python and its server extras are installed (bench/bench_server.py installs them).

N concurrent conversations of T turns (greedy, max 24 tokens per reply, non-streamed), each system
on a fresh server process. Reports per turn (turns 2..T, where continuation matters) p50/p99
latency, prompt tokens computed (prompt - cached) and the new input's tokens. Keys:
responses_computes_only_new_input (every turn computed <= what the prompt_cache_key path
computed), responses_vs_prompt_cache_key_p50 (goal <= 1.1), computed tokens per turn per system.

    python -m bench.bench_responses [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from bench.bench_server import _free_port, _has_server, _process, _q  # noqa: E402
from bench.common import machine, print_table, write_results  # noqa: E402
from bench.peers.llamacpp_peer import llama_cpp_missing  # noqa: E402

COUNTRIES = ["France", "Italy", "Spain", "Germany", "Japan", "Portugal", "Peru", "Egypt", "India", "Chile"]
MAX_TOKENS = 24


def _questions(conv: int, turns: int) -> list[str]:
    names = COUNTRIES[conv % len(COUNTRIES):] + COUNTRIES[:conv % len(COUNTRIES)]
    return [f"Hi! What is the capital of {names[0]}?"] + [f"And of {c}?" for c in names[1:turns]]


async def conversation(client, mode: str, conv: int, turns: int) -> list[dict]:
    rows, msgs, prev = [], [], None
    for t, q in enumerate(_questions(conv, turns)):
        t0 = time.perf_counter()
        if mode == "responses_chain":
            r = await client.responses.create(model="m", input=q, previous_response_id=prev, temperature=0,
                                              max_output_tokens=MAX_TOKENS)
            prev, text, u = r.id, r.output_text, r.usage
            prompt, cached = u.input_tokens, u.input_tokens_details.cached_tokens
        else:
            msgs.append({"role": "user", "content": q})
            extra = {"prompt_cache_key": f"conv-{conv}"} if mode == "chat_prompt_cache_key" else {}
            r = await client.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=MAX_TOKENS,
                                                     extra_body=extra)
            text, u = r.choices[0].message.content or "", r.usage
            details = getattr(u, "prompt_tokens_details", None)
            prompt, cached = u.prompt_tokens, (getattr(details, "cached_tokens", 0) or 0) if details else 0
            msgs.append({"role": "assistant", "content": text})
        rows.append({"turn": t, "s": time.perf_counter() - t0, "prompt": prompt, "computed": prompt - cached,
                     "text": text})
    return rows


def run(mode: str, n: int, turns: int, gguf: str) -> list[list[dict]]:
    import openai

    port = _free_port()
    if mode == "llamacpp_server":
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", str(port), "--n_threads", "2",
               "--n_ctx", "8192", "--chat_format", "chatml"]
        ready = f"http://127.0.0.1:{port}/v1/models"
    else:
        cmd = [sys.executable, "-m", "agentrt.cli", "serve", "--port", str(port), "--served-model-name", "m",
               "--log-level", "warning"]
        ready = f"http://127.0.0.1:{port}/health"
    with _process(cmd, ready):
        async def main():
            async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench-key-0",
                                          max_retries=0, timeout=600) as client:
                await conversation(client, mode, 99, 2)  # warm-up
                return await asyncio.gather(*(conversation(client, mode, c, turns) for c in range(n)))
        return asyncio.run(main())


def summary(convs: list[list[dict]]) -> dict:
    later = [r for rows in convs for r in rows[1:]]
    lat = [r["s"] for r in later]
    return {"turns": len(later), "per_turn_s_p50": _q(lat, 0.5), "per_turn_s_p99": _q(lat, 0.99),
            "computed_per_turn": statistics.mean(r["computed"] for r in later),
            "prompt_per_turn": statistics.mean(r["prompt"] for r in later)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 conversations x 6 turns (minutes)")
    args = ap.parse_args()
    from agentrt.model.loaders.files import resolve_source

    n, turns = (4, 6) if args.quick else (8, 10)
    gguf = str(resolve_source("smollm2-135m"))
    t0 = time.perf_counter()
    modes = ["responses_chain", "chat_prompt_cache_key", "chat_resend"]
    reasons = {}
    if (why := llama_cpp_missing()) is None and _has_server():
        modes.append("llamacpp_server")
    else:
        reasons["llamacpp_server"] = why or "llama_cpp.server's extras are missing (bench/bench_server.py installs them)"
    raw = {m: run(m, n, turns, gguf) for m in modes}
    systems = {m: summary(v) for m, v in raw.items()}
    chain, keyed = raw["responses_chain"], raw["chat_prompt_cache_key"]
    only_new = all(a["computed"] <= b["computed"] for ca, cb in zip(chain, keyed) for a, b in zip(ca[1:], cb[1:]))
    same_text = all(a["text"] == b["text"] for ca, cb in zip(chain, keyed) for a, b in zip(ca, cb))
    out = {"machine": machine(), "quick": args.quick, "conversations": n, "turns": turns, "systems": systems,
           "responses_computes_only_new_input": only_new, "responses_same_replies_as_prompt_cache_key": same_text,
           "responses_vs_prompt_cache_key_p50": systems["responses_chain"]["per_turn_s_p50"]
           / systems["chat_prompt_cache_key"]["per_turn_s_p50"],
           "computed_tokens_per_turn": {m: s["computed_per_turn"] for m, s in systems.items()},
           "reasons": reasons, "bench_wall_s": time.perf_counter() - t0,
           "notes": ["turns 2..T only (the first turn of every system computes its whole prompt)",
                     "each system on a fresh server process; non-streamed, greedy, max 24 tokens",
                     "llama_cpp.server reports no cached tokens: its computed/turn is its prompt/turn"]}
    rows = [[m, f"{s['per_turn_s_p50'] * 1e3:.0f}", f"{s['per_turn_s_p99'] * 1e3:.0f}",
             f"{s['computed_per_turn']:.1f}", f"{s['prompt_per_turn']:.1f}"] for m, s in systems.items()]
    print_table(f"{n} conversations x {turns} turns", ["system", "turn p50 ms", "turn p99 ms", "computed/turn",
                                                       "prompt/turn"], rows)
    print({k: v for k, v in out.items() if not isinstance(v, (dict, list))})
    print("wrote", write_results("responses", out))


if __name__ == "__main__":
    main()
