"""Forward-step speed: agentrt's paths vs llama-cpp-python on the same GGUF, in one run.

Decode ms/step at batch 1 and 8 (context 128, a fixed input token every step, so end of
generation never cuts a run short), prefill tokens/s at 256/1024 tokens, for agentrt with the
GGUF's quantization kept ("native", fused kernels), fp32 fused and fp32 eager (the reference),
and llama-cpp-python (2 threads, prompt evaluation and decode timed separately). Rounds of the
two systems alternate and medians are kept (this machine is shared and noisy). Also: measured
read bandwidth and the fraction of it a batch-1 step reaches, peak RSS of loading the model
(native vs fp32) and cold/warm start (load + first token with an empty/warm kernel cache),
each in a fresh process. Batch invariance: prefill of the default (invariant) path beside
load_model(batch_invariant=False) (long chunks through torch SDPA), also for a chunk after a long
cached prefix, and `deterministic` with the invariance cases checked on the embedded model
(bench/cases/invariance_case.py). The mixture-of-experts case (bench/cases/moe_case.py): a random Q4_K
Qwen3-MoE GGUF beside llama.cpp (moe_* keys); decode steps at contexts 128-4096 and a real
turn's cost per token through Engine.generate (bench/cases/context_case.py); the sliding-window case (bench/cases/swa_case.py): a
random Gemma 3 GGUF at 4x its window (swa_* keys). Writes bench/results/model.json.

    python -m bench.bench_model [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

from agentrt.model.loaders.files import resolve_source  # noqa: E402
from agentrt.model.loaders.load import load_model  # noqa: E402
from bench.cases import context_case, invariance_case, moe_case, swa_case  # noqa: E402
from bench.common import (  # noqa: E402
    ROOT,
    decode_weight_bytes,
    gemm_flops,
    machine,
    print_table,
    read_bandwidth,
    timeit,
    write_results,
)
from bench.peers.forward_step import CTX, AgentrtStep, LlamaCppStep, interleaved  # noqa: E402
from bench.peers.llamacpp_peer import ensure_llama_cpp, llama_cpp_missing  # noqa: E402

SDPA = "agentrt native, SDPA prefill (batch_invariant=False)"
LONG = (3584, 512)  # a 512-token chunk after a 3,584-token cached prefix


_PROBE = """
import resource, sys, time
t0 = time.perf_counter()
from agentrt.model.loaders.load import load_model
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
t1 = time.perf_counter()
lm = load_model("smollm2-135m", quantize=sys.argv[1])
generate(lm.model, [1, 2, 3], SamplingParams(max_tokens=1))
t2 = time.perf_counter()
print(t2 - t1, t1 - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def probe(quantize: str, cache: str) -> tuple[float, float, float]:
    """(load + first token s, import s, peak RSS MB) of a fresh process."""
    env = dict(os.environ, AGENTRT_KERNEL_CACHE=cache, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _PROBE, quantize], capture_output=True, text=True,
                         env=env, check=True, cwd=ROOT).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def starts() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        cold = probe("native", cache)  # empty kernel cache: the kernels compile
        warm = probe("native", cache)
        fp32 = probe("none", cache)
    return {"cold_start_s": cold[0], "warm_start_s": warm[0], "import_s": warm[1],
            "peak_rss_mb_native": warm[2], "peak_rss_mb_fp32": fp32[2], "fp32_start_s": fp32[0]}


def int8_gemm_peak(m: int = 1024, n: int = 3072, k: int = 576) -> dict:
    """Measured int8 GEMM ops/s at a prefill-sized layer (gate_up, 1024 rows): agentrt's kernel
    and fbgemm's dynamic int8 linear (activations quantized on the fly, as here)."""
    from agentrt.kernels.packing import pack, qgemm, quantize_int8

    w, x = torch.randn(n, k), torch.randn(m, k)
    pw = pack(quantize_int8(w))
    fb = torch.ao.nn.quantized.dynamic.Linear(k, n)
    fb.set_weight_bias(torch.quantize_per_channel(w, (w.abs().amax(1) / 127).clamp(min=1e-8),
                                                  torch.zeros(n, dtype=torch.long), 0, torch.qint8), None)
    ops = 2 * m * n * k
    with torch.inference_mode():
        return {"agentrt_int8_ops_s": ops / timeit(lambda: qgemm(x, pw), repeat=5),
                "fbgemm_int8_ops_s": ops / timeit(lambda: fb(x), repeat=5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and steps (minutes)")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install llama-cpp-python when it is missing (its rows: not run)")
    args = ap.parse_args()
    ensure_llama_cpp(not args.no_install)
    rounds, steps = (3, 16) if args.quick else (7, 32)
    res: dict = {"machine": machine(), "context": CTX, "rounds": rounds, "steps_per_round": steps}
    res.update(starts())
    bw = read_bandwidth()
    peaks = {"fp32_gemm_flops": gemm_flops(torch.float32), **int8_gemm_peak()}
    gguf = str(resolve_source("smollm2-135m"))
    native = load_model("smollm2-135m", quantize="native")
    fp32 = load_model("smollm2-135m", quantize="none")
    systems = {"agentrt native": AgentrtStep(native, "fused"), "agentrt fp32": AgentrtStep(fp32, "fused"),
               "agentrt fp32 eager": AgentrtStep(fp32, "eager")}
    missing = llama_cpp_missing()
    if missing is None:
        systems["llama.cpp"] = LlamaCppStep(gguf)
    res["llama_cpp"] = missing or "llama-cpp-python, same GGUF, 2 threads"
    b1 = interleaved(systems, "decode_round", rounds, 1, steps)
    b8 = interleaved({k: v for k, v in systems.items() if k != "llama.cpp"}, "decode_round", rounds, 8, steps)
    # prefill with long chunks attending through torch SDPA (batch_invariant=False: the path
    # before invariance, kept as a switch) beside the default, and a chunk after a long prefix
    sdpa = load_model("smollm2-135m", quantize="native", batch_invariant=False)
    with_sdpa = {**systems, SDPA: AgentrtStep(sdpa, "fused")}
    pre = {n: interleaved(with_sdpa, "prefill_round", rounds, n) for n in (256, 1024)}
    long_ctx = interleaved({k: with_sdpa[k] for k in ("agentrt native", SDPA)}, "prefill_round", rounds,
                           LONG[1], LONG[0])
    wbytes = decode_weight_bytes(native.model)
    layer_params = sum(p.numel() for b in fp32.model.blocks for p in b.parameters())  # (the head: last row only)
    native_ops = 2 * layer_params * 1024 / pre[1024]["agentrt native"]
    fp32_ops = 2 * layer_params * 1024 / pre[1024]["agentrt fp32"]
    int8_peak = max(peaks["agentrt_int8_ops_s"], peaks["fbgemm_int8_ops_s"])
    res.update({
        "read_bytes_per_s": bw, "weight_bytes_native": wbytes, "weight_bytes_fp32": decode_weight_bytes(fp32.model),
        "decode_b1_step_ms": {k: v * 1e3 for k, v in b1.items()},
        "decode_b8_step_ms": {k: v * 1e3 for k, v in b8.items()},
        "prefill_tok_s": {str(n): {k: n / v for k, v in p.items()} for n, p in pre.items()},
        f"prefill_{LONG[1]}_after_{LONG[0]}_tok_s": {k: LONG[1] / v for k, v in long_ctx.items()},
        "prefill_1024_invariant_over_sdpa": pre[1024][SDPA] / pre[1024]["agentrt native"],
        "batch_invariant": native.model.batch_invariant,
        **invariance_case.check(native),
        "batch_invariant_false_deterministic": invariance_case.check(sdpa)["deterministic"],
        "decode_b8_step_over_b1_step": b8["agentrt native"] / b1["agentrt native"],
        "decode_b1_bandwidth_fraction": wbytes / bw / b1["agentrt native"],
        "gemm_peaks": peaks,
        "prefill_1024_fraction_of_int8_gemm_peak": native_ops / int8_peak,
        "prefill_1024_fraction_of_fp32_gemm_peak_fp32_path": fp32_ops / peaks["fp32_gemm_flops"],
    })
    res.update(moe_case.run(rounds, steps))
    res.update(swa_case.run(rounds, steps))
    res.update(context_case.run(rounds, steps))
    if "llama.cpp" in systems:
        res["decode_b1_speedup_vs_llamacpp"] = b1["llama.cpp"] / b1["agentrt native"]
        res["prefill_1024_speedup_vs_llamacpp"] = pre[1024]["llama.cpp"] / pre[1024]["agentrt native"]
    rows = [[k, b1[k] * 1e3 if k in b1 else "-", b8[k] * 1e3 if k in b8 else "-", 256 / pre[256][k],
             1024 / pre[1024][k], LONG[1] / long_ctx[k] if k in long_ctx else "-"] for k in with_sdpa]
    print_table(f"forward speed, SmolLM2-135M (context {CTX}, medians of {rounds} alternating rounds)",
                ["system", "decode b1 ms/step", "decode b8 ms/step", "prefill 256 tok/s", "prefill 1024 tok/s",
                 f"prefill {LONG[1]} after {LONG[0]} tok/s"], rows)
    print("deterministic (greedy tokens equal a cold single-sequence run in every case):", res["deterministic"],
          res["invariance_cases"])
    keys = ("decode_b1_speedup_vs_llamacpp", "decode_b8_step_over_b1_step", "decode_b1_bandwidth_fraction",
            "prefill_1024_speedup_vs_llamacpp", "prefill_1024_fraction_of_int8_gemm_peak",
            "prefill_1024_fraction_of_fp32_gemm_peak_fp32_path", "prefill_1024_invariant_over_sdpa", "peak_rss_mb_native", "peak_rss_mb_fp32", "cold_start_s", "warm_start_s",
            "decode_b1_step_ctx4096_over_ctx128", "decode_b8_step_over_b1_step_ctx4096",
            "turn_decode_ms_per_token_over_step_ms")
    print(json.dumps({k: round(res[k], 3) for k in keys if k in res}, indent=1))
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; weights read per native step {wbytes / 1e6:.1f} MB")
    print("wrote", write_results("model", res))


if __name__ == "__main__":
    main()
