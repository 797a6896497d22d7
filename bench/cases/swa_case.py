"""The sliding-window case of bench_model: a random-weight Gemma 3 GGUF (window 512, five local
layers per global one) decoding at context 2048 (4x the window), agentrt beside llama-cpp-python
on the same file, and beside the same weights with full attention on every layer.

The file: 18 layers, hidden 640, 4 heads / 1 KV head of 256, MLP 2048 (Gemma 3 270M's shape),
every matrix Q8_0, the SmolLM2 tokenizer (bench/cases/random_gguf.py). KV bytes per session at that
context, measured: an engine session after one turn of CTX tokens (agentrt's local layers keep
their pages in a pool of their own and release what the session slid past: kv/window.py),
beside full attention and llama.cpp's sliding-window cache (the window on local layers).

    python -m bench.cases.swa_case [--quick]     (bench_model.py runs it too)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from bench.cases.random_gguf import add_smollm2_tokenizer, cached_gguf, finish, new_writer  # noqa: E402

SHAPE = dict(layers=18, hidden=640, heads=4, kv_heads=1, head_dim=256, ffn=2048, window=512)
CTX, PS, TOKEN = 2048, 16, 7


def swa_gguf(shape: dict = SHAPE) -> Path:
    name = "gemma3-" + "-".join(f"{k}{v}" for k, v in shape.items()) + ".Q8_0.gguf"
    return cached_gguf(name, lambda path: _write(path, shape))


def _write(path: Path, s: dict) -> None:
    import gguf

    q8, f32 = gguf.GGMLQuantizationType.Q8_0, np.float32
    rng = np.random.default_rng(1)
    w = new_writer(path, "gemma3", "agentrt-bench-swa", s, s["ffn"])
    w.add_sliding_window(s["window"])
    vocab = add_smollm2_tokenizer(w)
    h, hd = s["hidden"], s["head_dim"]

    def mat(rows: int, cols: int):
        return gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.03).astype(f32), q8)

    w.add_tensor("token_embd.weight", mat(vocab, h), raw_dtype=q8)
    w.add_tensor("output_norm.weight", np.ones(h, f32))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.add_tensor(b + name + ".weight", np.ones(h, f32))
        for name in ("attn_q_norm", "attn_k_norm"):
            w.add_tensor(b + name + ".weight", np.ones(hd, f32))
        shapes = {"attn_q": (s["heads"] * hd, h), "attn_k": (s["kv_heads"] * hd, h), "attn_v": (s["kv_heads"] * hd, h),
                  "attn_output": (h, s["heads"] * hd), "ffn_gate": (s["ffn"], h), "ffn_up": (s["ffn"], h),
                  "ffn_down": (h, s["ffn"])}
        for name, (rows, cols) in shapes.items():
            w.add_tensor(b + name + ".weight", mat(rows, cols), raw_dtype=q8)
    finish(w)


class Ours:
    """agentrt batch-1 decode at context CTX (the prompt prefilled once per round, untimed)."""

    def __init__(self, model):
        self.model = model

    def decode_round(self, steps: int) -> float:
        from agentrt.kv.store import KVStore
        from agentrt.model.batch import SeqChunk, build_batch

        m = self.model
        pages = list(range(-(-(CTX + steps + 1) // PS)))
        kv = KVStore.allocate(m.cfg, len(pages), PS, m.kv_dtype)
        fb = build_batch([SeqChunk(list(range(5, 5 + CTX)), 0, pages)], PS)
        m(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)
        t0 = time.perf_counter()
        for s in range(steps):
            f = build_batch([SeqChunk([TOKEN], CTX + s, pages)], PS)
            m.ops.argmax(m(f.input_ids, f.positions, kv, f.meta, f.logits_rows)).tolist()
        return (time.perf_counter() - t0) / steps


class LlamaCpp:
    def __init__(self, path: str):
        from llama_cpp import Llama

        self.llm = Llama(model_path=path, n_ctx=CTX + 256, n_threads=2, n_threads_batch=2, n_batch=512,
                         verbose=False)

    def decode_round(self, steps: int) -> float:
        self.llm.reset()
        self.llm.eval(list(range(5, 5 + CTX)))
        t0 = time.perf_counter()
        for _ in range(steps):
            self.llm.eval([TOKEN])
        return (time.perf_counter() - t0) / steps


def kv_bytes(cfg, layers_window: list[int], ctx: int, elem: int = 2) -> int:
    """KV bytes of one session at `ctx` tokens when layer i keeps layers_window[i] tokens (0: all)."""
    per_token = 2 * cfg.num_kv_heads * cfg.head_dim * elem
    return sum(per_token * (min(ctx, w) if w else ctx) for w in layers_window)


def session_kv_bytes(model) -> tuple[int, int]:
    """(KV bytes one engine session holds after a turn of CTX prompt tokens, of which local
    layers'), counted from the pages it holds: every page's global layers, and the local
    layers of the pages that still have their local page."""
    from agentrt.config import EngineConfig
    from agentrt.engine.core import EngineCore
    from agentrt.kv.store import KVStore
    from agentrt.sampling import SamplingParams

    core = EngineCore(model, EngineConfig(kv_cache_tokens=16384, response_cache_size=0))
    es = core.open_session(core.pool.acquire("session", 0))
    core.add_request(list(range(5, 5 + CTX)), SamplingParams(max_tokens=4), lambda ev: None, session=es)
    while core.has_work():
        core.step()
    local, ps = core.alloc.local, core.cfg.page_size
    glob, loc = (KVStore.bytes_per_token(model.cfg, model.kv_dtype, local=x) * ps for x in (False, True))
    kept = sum(local.present(p) for p in es.seq.pages) * loc
    return len(es.seq.pages) * glob + kept, kept


def run(rounds: int, steps: int) -> dict:
    from agentrt.model.loaders.load import load_model
    from bench.peers.llamacpp_peer import llama_cpp_missing

    path = swa_gguf()
    windowed = load_model(str(path), quantize="native").model
    full = load_model(str(path), quantize="native").model
    for b in full.blocks:  # the same weights, every layer attending the whole context
        b.attn.window = 0
    systems = {"agentrt native (window 512)": Ours(windowed), "agentrt native, full attention": Ours(full)}
    missing = llama_cpp_missing()
    if missing is None:
        systems["llama.cpp"] = LlamaCpp(str(path))
    for s in systems.values():
        s.decode_round(2)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(rounds):
        for k, s in systems.items():
            times[k].append(s.decode_round(steps))
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    cfg = windowed.cfg
    windows = [b.attn.window for b in windowed.blocks]
    elem = torch.empty((), dtype=windowed.kv_dtype).element_size()
    held, held_local = session_kv_bytes(windowed)
    res = {
        "swa_model": {**SHAPE, "file": path.name, "context": CTX, "windows": windows},
        "swa_llama_cpp": missing or "llama-cpp-python, same GGUF, 2 threads",
        "swa_decode_b1_step_ms_ctx2048": ms,
        "swa_decode_window_over_full_attention": ms["agentrt native (window 512)"] / ms["agentrt native, full attention"],
        "swa_kv_bytes_per_session": {  # at agentrt's KV dtype
            "agentrt (measured: a session after a 2048-token turn)": held,
            "full attention": kv_bytes(cfg, [0] * cfg.num_layers, CTX, elem),
            "window on local layers (llama.cpp's cache)": kv_bytes(cfg, windows, CTX, elem),
        },
        "swa_kv_local_bytes_per_session": held_local,
        "swa_kv_bytes_per_session_over_full_attention": held / kv_bytes(cfg, [0] * cfg.num_layers, CTX, elem),
    }
    if missing is None:
        res["swa_decode_speedup_vs_llamacpp"] = ms["llama.cpp"] / ms["agentrt native (window 512)"]
    return res


def main() -> None:
    from bench.common import RESULTS, machine, print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(*((3, 16) if args.quick else (7, 32)))
    print_table(f"sliding window (Gemma 3 layout, window 512, context {CTX})", ["system", "decode b1 ms/step"],
                [[k, v] for k, v in res["swa_decode_b1_step_ms_ctx2048"].items()])
    print(json.dumps({k: v for k, v in res.items() if k.startswith(("swa_decode_", "swa_kv"))}, indent=1))
    old = RESULTS / "model.json"
    merged = {**(json.loads(old.read_text()) if old.is_file() else {}), **res, "swa_machine": machine()}
    print("wrote", write_results("model", merged))


if __name__ == "__main__":
    main()
