"""Mixture-of-experts MLP (Qwen3-MoE, Mixtral, OLMoE): a router and `num_experts` SwiGLU experts.

Routing, as all three families define it: router logits = h @ W_r^T; softmax over every expert
in float32; the `experts_per_token` largest probabilities are the token's experts and weights,
renormalised to sum to 1 when `norm_topk_prob` (Mixtral always; Qwen3-MoE per config; OLMoE not).
Qwen2-MoE adds a shared expert that every token runs, weighted by sigmoid(h . w_shared_gate)
(the torch path; the grouped kernel runs the routed experts and the layer-by-layer fused path
adds the shared one).

Two paths give the same routing and experts:
  * `forward` (torch): per expert, the tokens routed to it in one GEMM each (gate_up, down), the
    weighted outputs added into their rows;
  * `agrt_moe` (kernels/csrc/moe.cpp) when every expert is quantized: the grouped native GEMM.
    It routes in the kernel, gathers each expert's rows, runs its quantized GEMMs once for all of
    them, and adds each row's experts in ascending expert order: a row's result depends on that
    row alone (batch-invariant, like every other kernel).
Experts stay in the checkpoint's own quantization (a GGUF's Q4_K experts run as Q4_K).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.model.config import ModelConfig
from agentrt.model.dense import Dense
from agentrt.model.quant import QLinear


class Expert(nn.Module):
    """One SwiGLU expert: down(silu(gate(x)) * up(x)), gate and up fused into one matmul."""

    def __init__(self, hidden: int, inter: int, dtype: torch.dtype):
        super().__init__()
        self.inter = inter
        self.gate_up = Dense(hidden, 2 * inter, False, dtype)
        self.down = Dense(inter, hidden, False, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.inter, -1)
        return self.down(nn.functional.silu(gate) * up)


class MoE(nn.Module):
    """forward(h [T, hidden]) -> the experts' weighted sum [T, hidden]."""

    gelu = False  # (SwiGLU experts, as a dense MLP's `gelu`)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.top_k, self.norm_topk = cfg.experts_per_token, cfg.norm_topk_prob
        self.router = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, dtype=dtype), requires_grad=False)
        self.experts = nn.ModuleList(Expert(cfg.hidden_size, cfg.expert_intermediate_size, dtype)
                                     for _ in range(cfg.num_experts))
        shared = cfg.shared_expert_intermediate_size
        self.shared = Expert(cfg.hidden_size, shared, dtype) if shared else None
        self.shared_gate = nn.Parameter(torch.empty(1, cfg.hidden_size, dtype=dtype), requires_grad=False) \
            if shared else None

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, expert ids [T, k]) of each token."""
        probs = torch.softmax((h @ self.router.t()).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights, ids

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(h)
        out = torch.zeros_like(h)
        for e in torch.unique(ids).tolist():  # ascending: each row adds its experts in id order
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y = self.experts[e](h[rows])
            out.index_add_(0, rows, y * weights[rows, slot, None].to(y.dtype))
        return out if self.shared is None else out + self.shared_part(h)

    def shared_part(self, h: torch.Tensor) -> torch.Tensor:
        """The shared expert's output, weighted by its sigmoid gate (Qwen2-MoE)."""
        if self.shared is None or self.shared_gate is None:
            raise ConfigError("shared_part of a mixture of experts without a shared expert")
        return torch.sigmoid(h @ self.shared_gate.t()) * self.shared(h)

    def quantized(self) -> bool:
        return all(isinstance(x.gate_up, QLinear) and isinstance(x.down, QLinear) and len(x.gate_up.parts) <= 3
                   and len(x.down.parts) <= 3 for x in self.experts)


def describe(moe: MoE, fill_linear) -> ctypes.Structure:
    """The native description of `moe` (native.Moe; `fill_linear` writes one native.Linear). The
    arrays it points into are kept on the structure, which the caller keeps alive."""
    n = len(moe.experts)
    gate_up, down = (native.Linear * n)(), (native.Linear * n)()
    for e, expert in enumerate(moe.experts):
        fill_linear(gate_up[e], expert.gate_up)
        fill_linear(down[e], expert.down)
    desc = native.Moe(moe.router.data_ptr(), ctypes.addressof(gate_up), ctypes.addressof(down), n, moe.top_k,
                      int(moe.norm_topk), moe.experts[0].inter)
    desc.keep = (gate_up, down, moe.router)
    return desc


def run_native(lib, desc: ctypes.Structure, h: torch.Tensor, x: torch.Tensor) -> None:
    """x += moe(h) in the kernel (both [T, hidden], contiguous float32)."""
    lib.agrt_moe(ctypes.addressof(desc), h.data_ptr(), h.shape[0], h.shape[1], x.data_ptr())
