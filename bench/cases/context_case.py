"""Decode at long contexts, and a real turn's cost per token (issue 34), on the embedded model.

Kernel steps: the native forward of one decode step of 1 and 8 sequences whose KV holds
`ctx` tokens each (128, 2048, 4096), medians of alternating rounds, with the float16 and the int8
KV store; batch 8 at 4096 also with a 3584-token prefix on shared pages (agents over one system
prompt, tools and history: their decode rows read it once), and llama-cpp-python's step at 4096 on the same GGUF. The int8 store's accuracy:
teacher-forced greedy agreement with float16 over 4096 tokens (the float32 store's agreement
with float16 beside it: the noise floor of a 135M model's argmax). A turn: one session holds a
~2k-token tool-calling conversation; its next turn (a short user delta) streams 64 tokens through
`Engine.generate` (greedy, end-of-turn ignored, speculation off so one token is one step); the
time per token after the first, over the kernel step at that context, is what the per-token path
(events, detokenisation, stops, the step loop) adds.

    python -m bench.cases.context_case --quick     # alone: merged into bench/results/model.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio
import torch

from agentrt import Engine, EngineConfig, SamplingParams, load_model  # noqa: E402
from agentrt.kv.store import KVStore  # noqa: E402
from agentrt.model.batch import SeqChunk, build_batch  # noqa: E402
from bench.common import RESULTS, ROOT, machine, print_table, write_results  # noqa: E402

PAGE = 16
CONTEXTS = (128, 2048, 4096)
TURN_TOKENS = 64
SHARED = 3584  # the shared prefix of the batch-8 case at 4096 (system prompt, tools, a long history)


def step_ms(model, ctx: int, batch: int, rounds: int, steps: int, shared: int = 0) -> float:
    """Median ms of one decode step of `batch` sequences at context `ctx` (random ids); the
    first `shared` tokens (a multiple of the page size) are one prefix on the same pages, as the
    radix cache shares agents' system prompt and tools."""
    per, dev = -(-(ctx + steps + 1) // PAGE), model.norm.device  # (a GPU model: KV and batches there)
    common = shared // PAGE
    kv = KVStore.allocate(model.cfg, common + (per - common) * batch, PAGE, model.kv_dtype, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    pages = [list(range(common)) + list(range(common + b * (per - common), common + (b + 1) * (per - common)))
             for b in range(batch)]
    gen = torch.Generator().manual_seed(ctx)
    head = torch.randint(100, 40000, (shared,), generator=gen).tolist()
    with torch.inference_mode():
        for b in range(batch):  # fill each sequence's KV (the shared prefix once)
            ids = head + torch.randint(100, 40000, (ctx - shared,), generator=gen).tolist()
            for s in range(0 if b == 0 else shared, ctx, 1024):
                fb = build_batch([SeqChunk(ids[s:min(s + 1024, ctx)], s, pages[b], 0)], PAGE).to(dev)
                model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)
        times = []
        for _ in range(rounds):
            for i in range(steps):
                fb = build_batch([SeqChunk([200 + i], ctx + i, pages[b]) for b in range(batch)], PAGE).to(dev)
                sync()
                t0 = time.perf_counter()
                model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)
                sync()
                times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def conversation(tok, target: int) -> list[list[int]]:
    """Two turns of a tool-calling chat: the first ~target tokens (system + tools + a long tool
    result), then a short user question."""
    from agentrt.conversation.chat_format import ChatFormat

    fmt = ChatFormat(tok)
    tools = [{"type": "function", "function": {"name": "search_docs", "description": "Search the docs.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
    rows = "\n".join(f"row {i}: order {1000 + i} shipped to warehouse {i % 7}, status ok" for i in range(400))
    msgs = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Find the shipping status of the orders."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "search_docs", "arguments": {"query": "orders"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": rows}]
    first = fmt.encode(msgs, tools=tools)
    while len(first) > target:  # trim the tool result to about `target` tokens
        rows = rows[:int(len(rows) * target / len(first) * 0.98)]
        msgs[-1]["content"] = rows
        first = fmt.encode(msgs, tools=tools)
    second = fmt.encode(msgs + [{"role": "assistant", "content": "All orders shipped."},
                                {"role": "user", "content": "Which warehouse got order 1003?"}], tools=tools)
    return [first, second]


async def turn_ms_per_token(lm, prompts: list[list[int]], reps: int) -> dict:
    """ms per streamed token after the first, through Engine.generate on a session."""
    cfg = EngineConfig(kv_cache_tokens=16384, response_cache_size=0, enable_speculation=False)
    per_token, ttft = [], []
    async with Engine(lm, cfg) as eng:
        for _ in range(reps):
            session = await eng.open_session()
            await eng.complete(prompts[0], SamplingParams(max_tokens=1), session=session)
            t0, stamps = time.perf_counter(), []
            async for ev in eng.generate(prompts[1], SamplingParams(max_tokens=TURN_TOKENS, ignore_eos=True),
                                         session=session):
                stamps += [time.perf_counter()] * len(ev.token_ids)
            await session.close()
            ttft.append(stamps[0] - t0)
            per_token.append(1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return {"turn_ms_per_token": statistics.median(per_token), "turn_ttft_s": statistics.median(ttft),
            "turn_context": len(prompts[1]) + TURN_TOKENS // 2}


def teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """Greedy next-token choice at every position of `ids` (chunks of 256)."""
    pages = list(range(-(-len(ids) // PAGE)))
    kv = KVStore.allocate(model.cfg, len(pages), PAGE, model.kv_dtype)
    out = []
    with torch.inference_mode():
        for s in range(0, len(ids), 256):
            fb = build_batch([SeqChunk(ids[s:s + 256], s, pages, want_logits=len(ids[s:s + 256]))], PAGE)
            out.append(model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows).argmax(-1))
    return torch.cat(out)


def agreement(lm, tokens: int = 4096) -> dict:
    """Teacher-forced greedy agreement of the int8 and float32 KV stores with float16, over the
    repository's docs (prose and code) and a tool-calling chat."""
    import copy

    text = (ROOT / "docs" / "architecture.md").read_text() + (ROOT / "README.md").read_text()
    ids = (conversation(lm.tokenizer, 600)[1] + lm.tokenizer.encode(text))[:tokens]
    choice = {}
    for dt in (torch.float16, torch.int8, torch.float32):
        m = copy.copy(lm.model)
        m.kv_dtype, m.fused_cache = dt, {}
        choice[dt] = teacher_forced(m, ids)
    same = lambda a, b: (choice[a] == choice[b]).float().mean().item()  # noqa: E731
    return {"kv_int8_teacher_forced_agreement": same(torch.int8, torch.float16),
            "kv_float32_teacher_forced_agreement": same(torch.float32, torch.float16),
            "kv_agreement_tokens": len(ids)}


def llama_cpp_step_ms(ctx: int, steps: int, rounds: int) -> float | None:
    """llama-cpp-python's decode step at context `ctx` (same GGUF, float16 KV, 2 threads)."""
    from agentrt.model.loaders.load import resolve_source
    from bench.peers.forward_step import TOKEN
    from bench.peers.llamacpp_peer import llama_cpp_missing

    if llama_cpp_missing() is not None:
        return None
    from llama_cpp import Llama

    llm = Llama(model_path=str(resolve_source("smollm2-135m")), n_ctx=ctx + steps + 8, n_threads=2,
                n_threads_batch=2, n_batch=1024, verbose=False)
    times = []
    for _ in range(rounds):
        llm.reset()
        llm.eval(list(range(100, 100 + ctx)))
        for _ in range(steps):
            t0 = time.perf_counter()
            llm.eval([TOKEN])
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def run(rounds: int, steps: int) -> dict:
    lms = {"float16": load_model("smollm2-135m"), "int8": load_model("smollm2-135m", kv_dtype="int8")}
    res: dict = {"decode_step_ms_by_context": {}, "decode_step_ms_by_context_int8_kv": {}}
    for kvd, key in (("float16", "decode_step_ms_by_context"), ("int8", "decode_step_ms_by_context_int8_kv")):
        for ctx in CONTEXTS:
            m = lms[kvd].model
            res[key][str(ctx)] = {"b1": step_ms(m, ctx, 1, rounds, steps), "b8": step_ms(m, ctx, 8, max(1, rounds // 2), steps)}
    for suffix, key in (("", "decode_step_ms_by_context"), ("_int8_kv", "decode_step_ms_by_context_int8_kv")):
        by = res[key]
        res["decode_b1_step_ctx4096_over_ctx128" + suffix] = by["4096"]["b1"] / by["128"]["b1"]
        res["decode_b8_step_over_b1_step_ctx4096" + suffix] = by["4096"]["b8"] / by["4096"]["b1"]
    for kvd, suffix in (("float16", ""), ("int8", "_int8_kv")):  # 8 agents over one 3584-token prefix
        b8 = step_ms(lms[kvd].model, 4096, 8, max(1, rounds // 2), steps, shared=SHARED)
        res["decode_b8_step_ms_ctx4096_shared_prefix" + suffix] = b8
        res["decode_b8_step_over_b1_step_ctx4096_shared_prefix" + suffix] = b8 / res[
            "decode_step_ms_by_context" + suffix]["4096"]["b1"]
    llama = llama_cpp_step_ms(4096, steps, rounds)
    res["decode_b1_step_ms_ctx4096"] = {"agentrt float16 KV": res["decode_step_ms_by_context"]["4096"]["b1"],
                                        "agentrt int8 KV": res["decode_step_ms_by_context_int8_kv"]["4096"]["b1"],
                                        "llama.cpp": llama}
    if llama is not None:
        res["decode_b1_speedup_vs_llamacpp_ctx4096"] = llama / res["decode_b1_step_ms_ctx4096"]["agentrt float16 KV"]
        res["decode_b1_speedup_vs_llamacpp_ctx4096_int8_kv"] = llama / res["decode_b1_step_ms_ctx4096"]["agentrt int8 KV"]
    res.update(agreement(lms["float16"]))
    lm = lms["float16"]
    turn = anyio.run(turn_ms_per_token, lm, conversation(lm.tokenizer, 2000), max(2, rounds))
    step = step_ms(lm.model, turn["turn_context"], 1, rounds, steps)
    res.update(turn, turn_step_ms=step, turn_decode_ms_per_token_over_step_ms=turn["turn_ms_per_token"] / step)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(*((3, 16) if args.quick else (7, 32)))
    i8 = res["decode_step_ms_by_context_int8_kv"]
    print_table("decode step by context (SmolLM2-135M native, ms)",
                ["context", "b1 f16 KV", "b8 f16 KV", "b1 int8 KV", "b8 int8 KV"],
                [[c, v["b1"], v["b8"], i8[c]["b1"], i8[c]["b8"]] for c, v in res["decode_step_ms_by_context"].items()])
    keys = ("decode_b1_step_ctx4096_over_ctx128", "decode_b1_step_ctx4096_over_ctx128_int8_kv",
            "decode_b8_step_over_b1_step_ctx4096", "decode_b8_step_over_b1_step_ctx4096_int8_kv",
            "decode_b8_step_over_b1_step_ctx4096_shared_prefix", "decode_b8_step_over_b1_step_ctx4096_shared_prefix_int8_kv",
            "decode_b1_step_ms_ctx4096", "decode_b1_speedup_vs_llamacpp_ctx4096",
            "decode_b1_speedup_vs_llamacpp_ctx4096_int8_kv", "kv_int8_teacher_forced_agreement",
            "kv_float32_teacher_forced_agreement", "turn_ms_per_token", "turn_step_ms", "turn_context",
            "turn_decode_ms_per_token_over_step_ms", "turn_ttft_s")
    print(json.dumps({k: res.get(k) for k in keys}, indent=1))
    old = RESULTS / "model.json"
    merged = {**(json.loads(old.read_text()) if old.is_file() else {}), **res, "context_machine": machine()}
    print("wrote", write_results("model", merged))


if __name__ == "__main__":
    main()
