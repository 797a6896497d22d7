"""Weight-only int8 linear layers for CPU decode (memory-bound: 4x fewer weight bytes than fp32).

Per-output-channel symmetric int8 weights with bf16 scales; activations enter the matmul in
bf16 (torch's CPU int8 weight kernel, `_weight_int8pack_mm`, is fast for bf16 inputs and slow
for fp32 ones) and the result returns in the model's dtype. Accuracy is checked against the fp32
model on logits and greedy agreement (tests/test_quant.py, bench/bench_decode.py). int4 is not
offered: torch's CPU int4 kernel needs a tiled weight layout per CPU and gave no reliable win
here, so fp32 (default, parity tests) and int8 are the two choices.
"""

from __future__ import annotations

import torch
from torch import nn

from agentrt.errors import ConfigError

QUANT_MODES = ("none", "int8")


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        w = weight.detach().float()  # [N, K]
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: nn.Module) -> "Int8Linear":
        """From an nn.Linear or a model Dense (both expose `weight` as [out, in])."""
        return cls(lin.weight, lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
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
