"""Checkpoint layouts -> the weights the model reads (Hugging Face Llama names, one matrix each).

* Phi-3's fused projections are split: `self_attn.qkv_proj` into q/k/v (rows [q | k | v]) and
  `mlp.gate_up_proj` into gate/up (rows [gate | up]).
* Mixture-of-experts: Mixtral's `block_sparse_moe.{gate, experts.j.w1/w3/w2}` become
  `mlp.{gate, experts.j.gate_proj/up_proj/down_proj}` (Qwen3-MoE's and OLMoE's names), and
  transformers v5's stacked `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] one
  matrix per expert.
* Partial rotary (only the first `rotary_dim` dims of each head rotate, as pairs (i, i + R/2)):
  q/k rows (and q/k norms) of every head are reordered by `rope.partial_rotary_order`, so the
  kernels' full rotate-half RoPE applies, with the pass-through dims turning at frequency 0.
  q and k share the order, so attention scores are unchanged; v and o are not touched.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from agentrt.kernels.packing import QuantMatrix
from agentrt.model.config import ModelConfig
from agentrt.model.loaders.lazy import LazyQuant, Weight
from agentrt.model.rope import partial_rotary_order


def rows(w: Any, index: Any) -> Any:
    """Rows `index` (a slice or an index tensor) of a weight, kept quantized for a QuantMatrix
    (its blocks run along a row: rows are independent), still unread for a LazyQuant."""
    if isinstance(w, LazyQuant):
        return w.select(index)
    if isinstance(w, QuantMatrix):
        return QuantMatrix(w.q[index].contiguous(), w.s[index].contiguous(),
                           None if w.m is None else w.m[index].contiguous(), w.z, w.group, w.fmt)
    return w[index].contiguous()


def _split(w: Any, sizes: list[int]) -> list[Any]:
    out, start = [], 0
    for n in sizes:
        out.append(rows(w, slice(start, start + n)))
        start += n
    return out


_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def _expert_names(weights: dict[str, Any]) -> None:
    for name in [n for n in weights if ".block_sparse_moe." in n]:
        new = name.replace(".block_sparse_moe.", ".mlp.")
        parts = new.split(".")
        if len(parts) > 2 and parts[-2] in _MIXTRAL:
            parts[-2] = _MIXTRAL[parts[-2]]
        weights[".".join(parts)] = weights.pop(name)
    for name in [n for n in weights if n.endswith("mlp.experts.gate_up_proj")]:  # [E, 2I, H]
        base = name[: -len("gate_up_proj")]
        for j, fused in enumerate(weights.pop(name)):
            weights[f"{base}{j}.gate_proj.weight"], weights[f"{base}{j}.up_proj.weight"] = fused.chunk(2)
    for name in [n for n in weights if n.endswith("mlp.experts.down_proj")]:  # [E, H, I]
        base = name[: -len("down_proj")]
        for j, down in enumerate(weights.pop(name)):
            weights[f"{base}{j}.down_proj.weight"] = down


W = TypeVar("W", bound=Weight)  # (float tensors only from a Hugging Face directory)


def to_model_layout(weights: dict[str, W], cfg: ModelConfig) -> dict[str, W]:
    """`weights` with fused projections split, expert names unified and partial-rotary heads
    reordered (in place)."""
    if cfg.is_moe:
        _expert_names(weights)
    for name in [n for n in weights if n.endswith("self_attn.qkv_proj.weight")]:
        base = name[: -len("qkv_proj.weight")]
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        weights[base + "q_proj.weight"], weights[base + "k_proj.weight"], weights[base + "v_proj.weight"] = \
            _split(weights.pop(name), [q, kv, kv])
    for name in [n for n in weights if n.endswith("mlp.gate_up_proj.weight")]:
        base = name[: -len("gate_up_proj.weight")]
        weights[base + "gate_proj.weight"], weights[base + "up_proj.weight"] = \
            _split(weights.pop(name), [cfg.intermediate_size] * 2)
    if cfg.rotary_dim is not None and cfg.rotary_dim != cfg.head_dim:
        _reorder_heads(weights, cfg, cfg.rotary_dim)
    return weights


def _reorder_heads(weights: dict[str, W], cfg: ModelConfig, rotary_dim: int) -> None:
    order = torch.tensor(partial_rotary_order(cfg.head_dim, rotary_dim))
    for name in list(weights):
        heads = cfg.num_heads if ".q_" in name else cfg.num_kv_heads if ".k_" in name else 0
        if not heads or not name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias",
                                           "q_norm.weight", "k_norm.weight")):
            continue
        t = weights[name]
        if name.endswith("norm.weight"):  # one [head_dim] vector shared by the heads
            weights[name] = rows(t, order)
            continue
        every = (torch.arange(heads)[:, None] * cfg.head_dim + order[None, :]).flatten()
        weights[name] = rows(t, every)
