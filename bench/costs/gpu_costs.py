"""GPU step cost models for an 8B model, from published figures (no GPU measured here).

Writes bench/costs/gpu_llama3_8b_h100.json and gpu_llama3_8b_rtx4090.json (agentrt.sim.StepCosts).
Model: Llama-3-8B in bf16 (Meta's config.json: 32 layers, hidden 4096, 32 query / 8 KV heads of
128, intermediate 14336, vocab 128256; 8.03e9 parameters, 16.06 GB of weights; KV 131,072 bytes
per token). Hardware, from the vendors' datasheets: H100 SXM5 80 GB -- HBM3 3.35 TB/s, 989.4
TFLOPS dense BF16 tensor, PCIe Gen5 x16 host link; GeForce RTX 4090 24 GB -- GDDR6X 1,008 GB/s,
165.2 TFLOPS dense FP16/BF16 tensor with FP32 accumulate, PCIe Gen4 x16.
Roofline with stated efficiencies (assumptions, typical of vLLM/SGLang-class engines with CUDA
graphs and FlashAttention): weights streamed at 75% (H100) / 80% (4090) of peak bandwidth per
decode step plus 0.3 ms of launch overhead; prefill matmuls at 60% of tensor peak; attention at
50% of tensor peak for prefill pairs, KV read at the same bandwidth fraction as weights; 20 us of
per-sequence work per step (sampling, bookkeeping); tier copies over PCIe at 50 / 25 GB/s.
Cross-check: the H100 model gives ~6.7 ms per batch-1 decode step (~150 tokens/s), in line with
published single-stream figures for Llama-3-8B bf16 on an H100; the 4090 one ~20 ms (~50 tok/s).

    python -m bench.costs.gpu_costs
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from agentrt.model.config import ModelConfig  # noqa: E402
from agentrt.sim.costs import StepCosts  # noqa: E402

HERE = Path(__file__).resolve().parent
LLAMA3_8B = ModelConfig(arch="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                        num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                        max_position_embeddings=8192)
PARAMS, WEIGHT_BYTES, KV_BYTES_PER_TOKEN = 8.03e9, 16.06e9, 2 * 32 * 8 * 128 * 2
PAIR_FLOPS = 4 * 32 * 128 * 32  # QK^T and PV, every head and layer, per (query, key) pair
GPUS = {
    "h100": dict(name="Llama-3-8B bf16 on one H100 SXM5 80GB (published figures)", bw=3.35e12, bw_eff=0.75,
                 flops=989.4e12, link=50e9),
    "rtx4090": dict(name="Llama-3-8B bf16 on one RTX 4090 24GB (published figures)", bw=1.008e12, bw_eff=0.80,
                    flops=165.2e12, link=25e9),
}


def costs(g: dict) -> StepCosts:
    bw = g["bw"] * g["bw_eff"]
    return StepCosts(
        g["name"], base_s=WEIGHT_BYTES / bw + 0.3e-3, per_seq_s=20e-6,
        per_token_s=2 * PARAMS / (0.60 * g["flops"]), per_pair_s=PAIR_FLOPS / (0.50 * g["flops"]),
        per_key_s=KV_BYTES_PER_TOKEN / bw, tier_copy_s_per_page=16 * KV_BYTES_PER_TOKEN / g["link"],
        page_tokens=16, source=__doc__.split("Writes")[0].strip() + " See bench/costs/gpu_costs.py.",
        details={"model": asdict(LLAMA3_8B), "peak_bytes_per_s": g["bw"], "bandwidth_efficiency": g["bw_eff"],
                 "peak_tensor_flops": g["flops"], "host_link_bytes_per_s": g["link"]})


def main() -> None:
    for key, g in GPUS.items():
        print("wrote", costs(g).save(HERE / f"gpu_llama3_8b_{key}.json"))


if __name__ == "__main__":
    main()
