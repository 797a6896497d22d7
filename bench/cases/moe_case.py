"""The mixture-of-experts case of bench_model: a random-weight Qwen3-MoE GGUF of a realistic
shape, run by agentrt (experts kept as Q4_K, the grouped native GEMM) and llama-cpp-python on the
same file, in one run.

The file: 24 layers, hidden 1024, 16 heads / 4 KV heads of 64, 8 experts of 1024, top 2 (~0.72B
parameters, ~0.26B active per token), every matrix Q4_K (random blocks, mins centring each
block: gguf has no K quantizer), router and norms F32, the SmolLM2 tokenizer copied from the
embedded GGUF so that llama.cpp loads it as it would a real one (bench/cases/random_gguf.py).

    python -m bench.cases.moe_case [--quick]     (bench_model.py runs it too)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.cases.random_gguf import add_smollm2_tokenizer, cached_gguf, finish, new_writer, q4k_blocks  # noqa: E402

SHAPE = dict(layers=24, hidden=1024, heads=16, kv_heads=4, head_dim=64, experts=8, used=2, expert_ff=1024)


def moe_gguf(shape: dict = SHAPE) -> Path:
    """The benchmark's MoE GGUF (written on first use)."""
    name = "moe-" + "-".join(f"{k}{v}" for k, v in shape.items()) + ".Q4_K.gguf"
    return cached_gguf(name, lambda path: _write(path, shape))


def _write(path: Path, s: dict) -> None:
    import gguf

    q4k, f32 = gguf.GGMLQuantizationType.Q4_K, np.float32
    rng = np.random.default_rng(0)
    w = new_writer(path, "qwen3moe", "agentrt-bench-moe", s, s["expert_ff"])
    w.add_expert_feed_forward_length(s["expert_ff"])
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["used"])
    vocab = add_smollm2_tokenizer(w)
    h, hd, e, ff = s["hidden"], s["head_dim"], s["experts"], s["expert_ff"]
    w.add_tensor("token_embd.weight", q4k_blocks(vocab, h, rng), raw_dtype=q4k)
    w.add_tensor("output_norm.weight", np.ones(h, f32))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        for name in ("attn_norm", "ffn_norm"):
            w.add_tensor(b + name + ".weight", np.ones(h, f32))
        for name in ("attn_q_norm", "attn_k_norm"):
            w.add_tensor(b + name + ".weight", np.ones(hd, f32))
        for name, (rows, cols) in {"attn_q": (s["heads"] * hd, h), "attn_k": (s["kv_heads"] * hd, h),
                                   "attn_v": (s["kv_heads"] * hd, h), "attn_output": (h, s["heads"] * hd)}.items():
            w.add_tensor(b + name + ".weight", q4k_blocks(rows, cols, rng), raw_dtype=q4k)
        w.add_tensor(b + "ffn_gate_inp.weight", (rng.standard_normal((e, h)) * 0.05).astype(f32))
        for name, (rows, cols) in {"ffn_gate_exps": (ff, h), "ffn_up_exps": (ff, h), "ffn_down_exps": (h, ff)}.items():
            w.add_tensor(b + name + ".weight", q4k_blocks(e * rows, cols, rng).reshape(e, rows, -1), raw_dtype=q4k)
    finish(w)


_RSS = """
import re, sys
if sys.argv[1] == "agentrt":
    from agentrt.model.loaders.load import load_model
    from agentrt.model.generate import generate
    from agentrt.sampling import SamplingParams
    lm = load_model(sys.argv[2], quantize="native")
    generate(lm.model, list(range(5, 69)), SamplingParams(max_tokens=4))
else:
    from llama_cpp import Llama
    llm = Llama(model_path=sys.argv[2], n_ctx=4096, n_threads=2, verbose=False)
    llm.eval(list(range(5, 69)))
# VmHWM: this process's own peak (ru_maxrss carries the parent's peak across fork + exec)
print(int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024)
"""


def peak_rss_mb(system: str, path: Path) -> float | None:
    """Peak RSS (MB, VmHWM) of a fresh process loading `path` and decoding a few tokens."""
    out = subprocess.run([sys.executable, "-c", _RSS, system, str(path)], capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None


def run(rounds: int, steps: int) -> dict:
    """The MoE rows and keys of model.json."""
    from agentrt.model.loaders.load import load_model
    from bench.peers.forward_step import AgentrtStep, LlamaCppStep, interleaved
    from bench.peers.llamacpp_peer import llama_cpp_missing

    path = moe_gguf()
    lm = load_model(str(path), quantize="native")
    cfg = lm.model.cfg
    total = sum(p.numel() for p in lm.model.parameters())  # (QLinear weights are not parameters)
    systems = {"agentrt native": AgentrtStep(lm, "fused")}
    missing = llama_cpp_missing()
    if missing is None:
        systems["llama.cpp"] = LlamaCppStep(str(path))
    b1 = interleaved(systems, "decode_round", rounds, 1, steps)
    b8 = interleaved({"agentrt native": systems["agentrt native"]}, "decode_round", rounds, 8, steps)
    pre = interleaved(systems, "prefill_round", rounds, 256)
    res = {
        "moe_model": {**SHAPE, "file": path.name, "file_bytes": path.stat().st_size, "arch": cfg.arch,
                      "dense_parameters": total},
        "moe_llama_cpp": missing or "llama-cpp-python, same GGUF, 2 threads",
        "moe_decode_b1_step_ms": {k: v * 1e3 for k, v in b1.items()},
        "moe_decode_b8_step_ms": {k: v * 1e3 for k, v in b8.items()},
        "moe_prefill_256_tok_s": {k: 256 / v for k, v in pre.items()},
        "moe_decode_b8_step_over_b1_step": b8["agentrt native"] / b1["agentrt native"],
        "moe_peak_rss_mb": {"agentrt native": peak_rss_mb("agentrt", path)},
    }
    if missing is None:
        res["moe_decode_b1_speedup_vs_llamacpp"] = b1["llama.cpp"] / b1["agentrt native"]
        res["moe_prefill_256_speedup_vs_llamacpp"] = pre["llama.cpp"] / pre["agentrt native"]
        res["moe_peak_rss_mb"]["llama.cpp"] = peak_rss_mb("llama.cpp", path)
    return res


def main() -> None:
    from bench.common import RESULTS, machine, print_table, write_results

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(*((3, 16) if args.quick else (7, 32)))
    rows = [[k, v, res["moe_decode_b8_step_ms"].get(k, "-"), res["moe_prefill_256_tok_s"][k],
             res["moe_peak_rss_mb"].get(k, "-")] for k, v in res["moe_decode_b1_step_ms"].items()]
    print_table("mixture of experts (Qwen3-MoE layout, 8 experts top 2, Q4_K)",
                ["system", "decode b1 ms/step", "decode b8 ms/step", "prefill 256 tok/s", "peak RSS MB"], rows)
    print(json.dumps({k: v for k, v in res.items() if k.endswith("vs_llamacpp")}, indent=1))
    old = RESULTS / "model.json"  # merged into bench_model's results
    merged = {**(json.loads(old.read_text()) if old.is_file() else {}), **res, "moe_machine": machine()}
    print("wrote", write_results("model", merged))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
