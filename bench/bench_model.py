"""Model speed: agentrt vs transformers on the same weights (the embedded SmolLM2), in one run.

Prefill tokens/s at 256/1024/2048 tokens, decode tokens/s at batch 1 and 8, and this machine's
measured fp32/bf16 GEMM FLOP/s and memory bandwidth with the fraction of each bound reached.
Writes bench/results/model.json.   python bench/bench_model.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import decode_weight_bytes, gemm_flops, machine, print_table, read_bandwidth, timeit, write_results  # noqa: E402
from agentrt.model.batch import SeqChunk, build_batch  # noqa: E402
from agentrt.model.kv import KVStore  # noqa: E402
from agentrt.model.loader import load_model  # noqa: E402

PS = 16


def ours_prefill(model, n: int) -> float:
    kv = KVStore.allocate(model.cfg, -(-n // PS), PS, model.dtype)
    fb = build_batch([SeqChunk(list(range(100, 100 + n)), 0, list(range(-(-n // PS))))], PS)
    return timeit(lambda: model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows), repeat=2)


def ours_decode(model, batch: int, ctx: int, steps: int) -> float:
    per = -(-(ctx + steps + 1) // PS)
    kv = KVStore.allocate(model.cfg, per * batch, PS, model.dtype)
    pages = [list(range(b * per, (b + 1) * per)) for b in range(batch)]
    fb = build_batch([SeqChunk(list(range(5, 5 + ctx)), 0, p) for p in pages], PS)
    model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)

    def run():
        for s in range(steps):
            f = build_batch([SeqChunk([7], ctx + s, p) for p in pages], PS)
            model.ops.argmax(model(f.input_ids, f.positions, kv, f.meta, f.logits_rows)).tolist()
    return timeit(run, repeat=2, warmup=0) / steps


def hf_model(path: Path):
    import transformers

    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32)
    return m.eval()


@torch.inference_mode()
def hf_prefill(m, n: int) -> float:
    ids = torch.arange(100, 100 + n)[None]
    return timeit(lambda: m(ids, use_cache=False), repeat=2)


@torch.inference_mode()
def hf_decode(m, batch: int, ctx: int, steps: int) -> float:
    ids = torch.arange(5, 5 + ctx).repeat(batch, 1)

    def run():
        out = m(ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = __import__("time").perf_counter()
        for _ in range(steps):
            out = m(tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        return __import__("time").perf_counter() - t0
    run()
    return min(run() for _ in range(2)) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and steps (minutes)")
    args = ap.parse_args()
    sizes = [256, 1024] if args.quick else [256, 1024, 2048]
    steps = 8 if args.quick else 24
    lm = load_model("smollm2-135m")
    ours = lm.model
    ref = hf_model(Path(lm.source))
    bounds = {"gemm_flops_fp32": gemm_flops(torch.float32), "gemm_flops_bf16": gemm_flops(torch.bfloat16),
              "read_bytes_per_s": read_bandwidth()}
    n_params = sum(p.numel() for p in ours.parameters())
    res: dict = {"machine": machine(), "bounds": bounds, "prefill": {}, "decode": {}}
    rows = []
    for n in sizes:
        a, b = n / ours_prefill(ours, n), n / hf_prefill(ref, n)
        frac = a * 2 * n_params / bounds["gemm_flops_fp32"]
        res["prefill"][str(n)] = {"agentrt_tok_s": a, "transformers_tok_s": b, "speedup": a / b,
                                  "fraction_of_fp32_gemm_peak": frac}
        rows.append([f"prefill {n}", a, b, a / b, f"{frac:.0%} of GEMM peak"])
    wbytes = decode_weight_bytes(ours)
    for batch in (1, 8):
        sa, sb = ours_decode(ours, batch, 128, steps), hf_decode(ref, batch, 128, steps)
        bound = wbytes / bounds["read_bytes_per_s"]
        res["decode"][f"batch{batch}"] = {
            "agentrt_tok_s": batch / sa, "transformers_tok_s": batch / sb, "speedup": sb / sa,
            "agentrt_step_ms": sa * 1e3, "bandwidth_bound_step_ms": bound * 1e3,
            "fraction_of_bandwidth_bound": bound / sa}
        rows.append([f"decode batch {batch}", batch / sa, batch / sb, sb / sa,
                     f"step {sa*1e3:.1f} ms vs bound {bound*1e3:.1f} ms ({bound/sa:.0%})"])
    res["weights_bytes_fp32"] = wbytes
    print_table("agentrt vs transformers (SmolLM2-135M fp32, same weights, tokens/s)",
                ["work", "agentrt", "transformers", "speedup", "vs machine bound"], rows)
    print(f"fp32 GEMM {bounds['gemm_flops_fp32']/1e9:.1f} GFLOP/s, bf16 GEMM "
          f"{bounds['gemm_flops_bf16']/1e9:.1f} GFLOP/s, read {bounds['read_bytes_per_s']/1e9:.1f} GB/s")
    print("wrote", write_results("model", res))


if __name__ == "__main__":
    main()
