"""Gemma 2 and Gemma 3 (text) hyperparameters and weights, from config.json or GGUF metadata.

What sets them apart (ModelConfig's Gemma fields): embeddings times sqrt(hidden); GeGLU (gelu,
tanh approximation); RMSNorm before and after both attention and MLP; attention scaled by
query_pre_attn_scalar ** -0.5; sliding-window layers (Gemma 2: every other one from layer 0;
Gemma 3: five of every six) beside global ones. Gemma 2 softcaps attention scores (50) and final
logits (30); Gemma 3 norms q and k per head and turns its local layers by a RoPE base of their
own (10,000, unscaled), its global ones by rope_theta (with linear scaling on 4B and up).

Gemma's RMSNorm multiplies by (1 + w): a Hugging Face checkpoint's norm weights get the 1 added
at load (llama.cpp's converter already added it in a GGUF).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from agentrt.errors import UnsupportedModel

HF_TYPES = {"gemma2": "gemma2", "gemma3_text": "gemma3"}  # model_type -> our architecture
PATTERN = {"gemma2": 2, "gemma3": 6}  # every PATTERN-th layer (1-based) is global, the others slide
LOCAL_THETA = 10000.0  # Gemma 3's local layers (llama.cpp: the same constant)
# GGUF tensor names of the four norms (the Llama map reads ffn_norm as the MLP's input norm)
GGUF_NORMS = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
              "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}


def sliding_layers(arch: str, n: int, layer_types: list[str] | None = None,
                   pattern: int | list | None = None) -> tuple[bool, ...]:
    """Which of n layers slide: config.json's layer_types, else a GGUF's
    `{arch}.attention.sliding_window_pattern` (every pattern-th layer global, or one flag per
    layer), else the family's pattern."""
    if layer_types:
        return tuple(t == "sliding_attention" for t in layer_types)
    if isinstance(pattern, list) and len(pattern) == n:
        return tuple(bool(x) for x in pattern)
    every = int(pattern) if isinstance(pattern, int) and pattern > 0 else PATTERN[arch]
    return tuple(bool((i + 1) % every) for i in range(n))


def hf_rope(raw: dict[str, Any], arch: str) -> tuple[dict[str, Any], float]:
    """(the global layers' RoPE parameters, the local layers' base; 0: the same table)."""
    params = raw.get("rope_parameters") or {}
    if arch == "gemma2":
        return params or raw.get("rope_scaling") or {}, 0.0
    if "full_attention" in params:  # (v5: one entry per layer type)
        local = params.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise UnsupportedModel("Gemma 3 with scaled RoPE on its sliding-window layers is not supported")
        return params["full_attention"], float(local.get("rope_theta") or LOCAL_THETA)
    return raw.get("rope_scaling") or {}, float(raw.get("rope_local_base_freq") or LOCAL_THETA)


def hf_fields(raw: dict[str, Any], arch: str, local_theta: float) -> dict[str, Any]:
    """The Gemma fields of ModelConfig from config.json (sliding window: hf.py)."""
    if raw.get("use_bidirectional_attention"):
        raise UnsupportedModel("Gemma 3 with bidirectional attention (an embedding model) is not supported")
    act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise UnsupportedModel(f"Gemma activation {act!r} is not supported (gelu_pytorch_tanh)")
    return {"embed_scale": math.sqrt(int(raw["hidden_size"])), "mlp_act": "gelu_tanh", "sandwich_norms": True,
            "query_scale": float(raw.get("query_pre_attn_scalar") or 0.0),
            "attn_softcap": float(raw.get("attn_logit_softcapping") or 0.0),
            "final_softcap": float(raw.get("final_logit_softcapping") or 0.0),
            "qk_norm": arch == "gemma3", "local_rope_theta": local_theta if arch == "gemma3" else 0.0}


def gguf_fields(meta: dict[str, Any], arch: str) -> dict[str, Any]:
    """The Gemma fields of ModelConfig from `{arch}.*` metadata, as llama.cpp runs the file (it
    does not store query_pre_attn_scalar: the 27B models, 46 / 62 layers, scale by hidden /
    heads, the others by head_dim; the window pattern is the family's)."""
    hidden, heads = int(meta[f"{arch}.embedding_length"]), int(meta[f"{arch}.attention.head_count"])
    big = int(meta[f"{arch}.block_count"]) == {"gemma2": 46, "gemma3": 62}[arch]
    return {"embed_scale": math.sqrt(hidden), "mlp_act": "gelu_tanh", "sandwich_norms": True,
            "query_scale": float(hidden // heads) if big else 0.0,
            "attn_softcap": float(meta.get(f"{arch}.attn_logit_softcapping") or 0.0),
            "final_softcap": float(meta.get(f"{arch}.final_logit_softcapping") or 0.0),
            "qk_norm": arch == "gemma3", "local_rope_theta": LOCAL_THETA if arch == "gemma3" else 0.0}


def add_one_to_norms(weights: dict[str, torch.Tensor]) -> None:
    """Gemma's (1 + w) RMSNorm as a plain one: every norm weight of a HF checkpoint + 1 (in place)."""
    for name in [n for n in weights if n.endswith("norm.weight")]:
        weights[name] = weights[name] + 1.0
