"""Weight-only int8 linear layers for CPU decode (memory-bound: 4x fewer weight bytes than fp32).

Per-output-channel symmetric int8 weights with bf16 scales; activations enter the matmul in
bf16 (torch's CPU int8 weight kernel, `_weight_int8pack_mm`, is fast for bf16 inputs and slow
for fp32 ones) and the result returns in the model's dtype. That kernel wins only while the
step is memory-bound (decode: a few rows); for prefill-sized inputs it is compute-bound in
bf16, which this class of CPU runs slowly, so the original dense weights are kept and used
above `DENSE_ROWS` rows (measured: int8 prefill 189 tok/s vs dense 357 at 1024 tokens;
decode step 48 ms vs 93 ms). Cost: the int8 copy adds a quarter of the fp32 weight memory. Accuracy is checked against the fp32
model on logits and greedy agreement (tests/test_quant.py, bench/bench_decode.py). int4 is not
offered: torch's CPU int4 kernel needs a tiled weight layout per CPU and gave no reliable win
here, so fp32 (default, parity tests) and int8 are the two choices.
"""

from __future__ import annotations

import torch
from torch import nn

from agentrt.errors import ConfigError

QUANT_MODES = ("none", "int8")
DENSE_ROWS = 16  # inputs with more rows than this use the dense weights


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dense: nn.Module | None = None):
        super().__init__()
        self.dense = dense
        w = weight.detach().float()  # [N, K]
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        # (the dense layer's own bias serves the dense path)

    @classmethod
    def from_linear(cls, lin: nn.Module) -> "Int8Linear":
        """From an nn.Linear or a model Dense (both expose `weight` as [out, in]); the layer
        itself is kept for prefill-sized inputs."""
        return cls(lin.weight, lin.bias, lin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.numel() // shape[-1]
        if rows == 0:  # e.g. the output head in a step where no request needs logits
            return x.new_empty(*shape[:-1], self.weight_int8.shape[0])
        if self.dense is not None and rows > DENSE_ROWS:
            return self.dense(x)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16),
                                               self.weight_int8, self.scales)
        y = y.to(x.dtype).reshape(*shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def quantize(model: nn.Module, mode: str) -> nn.Module:
    """Replace the decoder's linear layers (and the output head) in place."""
    if mode not in QUANT_MODES:
        raise ConfigError(f"quantize={mode!r} is not supported; choose one of {QUANT_MODES}")
    if mode == "none":
        return model
    for block in model.blocks:
        block.attn.qkv = Int8Linear.from_linear(block.attn.qkv)
        block.attn.o = Int8Linear.from_linear(block.attn.o)
        block.mlp.gate_up = Int8Linear.from_linear(block.mlp.gate_up)
        block.mlp.down = Int8Linear.from_linear(block.mlp.down)
    model.lm_head = Int8Linear.from_linear(model.lm_head)  # a quantized copy when tied
    return model
