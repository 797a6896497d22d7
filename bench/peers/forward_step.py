"""The systems bench_model.py times one forward step of, behind one interface:
`decode_round(batch, steps)` (seconds per decode step) and `prefill_round(n)` (seconds to
prefill n tokens). `AgentrtStep`: one loaded model on one forward path; `LlamaCppStep`:
llama-cpp-python on the same GGUF. `interleaved` alternates their rounds and keeps medians
(bench/cases/moe_case.py and bench_decode.py use them too)."""

from __future__ import annotations

import statistics
import time

from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch

PS, CTX, TOKEN = 16, 128, 7  # page size, decode context, the fixed input token of every step


class AgentrtStep:
    """agentrt decode/prefill on one loaded model and forward path."""

    def __init__(self, lm, path: str):
        self.model, self.path = lm.model, path

    def decode_round(self, batch: int, steps: int) -> float:
        per = -(-(CTX + steps + 1) // PS)
        kv = KVStore.allocate(self.model.cfg, per * batch, PS, self.model.kv_dtype)
        pages = [list(range(b * per, (b + 1) * per)) for b in range(batch)]
        fb = build_batch([SeqChunk(list(range(5, 5 + CTX)), 0, p) for p in pages], PS)
        self.model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=self.path)
        t0 = time.perf_counter()
        for s in range(steps):  # what an engine step does: batch metadata, forward, argmax to host
            f = build_batch([SeqChunk([TOKEN], CTX + s, p) for p in pages], PS)
            logits = self.model(f.input_ids, f.positions, kv, f.meta, f.logits_rows, path=self.path)
            self.model.ops.argmax(logits).tolist()
        return (time.perf_counter() - t0) / steps

    def prefill_round(self, n: int, start: int = 0) -> float:
        """Seconds to prefill n tokens at positions [start, start + n) (a chunk after a cached
        prefix of `start` tokens: the prefix's KV is computed first, untimed)."""
        pages = list(range(-(-(start + n) // PS)))
        kv = KVStore.allocate(self.model.cfg, len(pages), PS, self.model.kv_dtype)
        if start:
            head = build_batch([SeqChunk(list(range(100, 100 + start)), 0, pages)], PS)
            self.model(head.input_ids, head.positions, kv, head.meta, head.logits_rows, path=self.path)
        fb = build_batch([SeqChunk(list(range(100 + start, 100 + start + n)), start, pages)], PS)
        t0 = time.perf_counter()
        self.model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=self.path)
        return time.perf_counter() - t0


class LlamaCppStep:
    """llama-cpp-python, the fair way: fixed tokens, prompt evaluation timed on its own."""

    def __init__(self, path: str, threads: int = 2):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                         n_batch=2048, verbose=False, logits_all=False)

    def decode_round(self, batch: int, steps: int) -> float:
        self.llm.reset()
        self.llm.eval(list(range(5, 5 + CTX)))
        t0 = time.perf_counter()
        for _ in range(steps):
            self.llm.eval([TOKEN])  # computes the next token's logits (llama.cpp has no EOS stop here)
        return (time.perf_counter() - t0) / steps

    def prefill_round(self, n: int) -> float:
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(list(range(100, 100 + n)))
        return time.perf_counter() - t0


def interleaved(systems: dict, fn: str, rounds: int, *args) -> dict[str, float]:
    """Median seconds of `fn(*args)` per system, rounds alternating between systems."""
    for s in systems.values():  # warm-up
        getattr(s, fn)(*args)
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(rounds):
        for k, s in systems.items():
            times[k].append(getattr(s, fn)(*args))
    return {k: statistics.median(v) for k, v in times.items()}
