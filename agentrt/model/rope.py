"""Rotary position embedding: the cos/sin tables, and RoPE scaling read from either format.

Scaling is kept in one form, llama.cpp's: a divisor per rotary frequency (`rope_freqs.weight`,
head_dim/2 values), so frequency i turns at base^(-2i/D) / factors[i] radians per position.

    Hugging Face rope_type   GGUF                                      factors
    "default"                (nothing)                                 None
    "linear" (factor f)      {arch}.rope.scaling.type="linear", .factor  f for every i
    "llama3"                 rope_freqs.weight (llama.cpp's converter   1 above the high-frequency
                             computes it from the four parameters)      cut, f below the low one,
                                                                        smoothed in between
    "yarn" (Qwen2.5 long)    .scaling.type="yarn", .factor,             1 (extrapolated) above the
                             .original_context_length                   beta_fast cut, f below
                                                                        beta_slow, a linear ramp between
    "longrope" (Phi-3)       (Phi-3 GGUFs: not yet)                     long_factor when the context
                                                                        is past the original, else short
    "dynamic" (NTK)          -                                          None within the context

Two types also scale attention: YaRN and long-RoPE multiply cos and sin by an attention factor
(YaRN: 0.1 ln f + 1, or as mscale / mscale_all_dim say; long-RoPE: sqrt(1 + ln f / ln original)),
kept as `ModelConfig.rope_attention_factor`. Where transformers recomputes the frequencies from the
current sequence length, agentrt keeps one table for its whole context, as llama.cpp and vLLM do:
dynamic NTK scales nothing up to `max_position_embeddings` (transformers' own values there), and
long-RoPE uses its long factors when `max_position_embeddings` is past the original context
(transformers' choice for any sequence longer than the original).
A GGUF keeps only the factors (llama.cpp's converter does not write the llama3 parameters,
and transformers' GGUF loader ignores rope_freqs), so both sources end as the same table.
Not implemented (UnsupportedModel): other types, and partial rotary (rope.dimension_count /
partial_rotary_factor below head_dim).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from agentrt.errors import CorruptModelFile, UnsupportedModel

HF_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")


def inv_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] fp32 inverse frequencies, computed as transformers does (so tables match bit for bit)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


class RopeTable(nn.Module):
    """cos/sin tables [max_pos, D] in fp32 (HF rotate-half layout); `factors` divide the
    frequencies (RoPE scaling, see the module docstring)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, factors: Sequence[float] | None = None,
                 attention_factor: float = 1.0, rotary_dim: int | None = None):
        super().__init__()
        rotary = rotary_dim or head_dim
        inv = inv_frequencies(rotary, theta)
        if factors is not None:
            inv = inv / torch.tensor(factors, dtype=torch.float32)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)  # [max_pos, R/2]
        # partial rotary (slots ordered by partial_rotary_order): the pass-through slots neither
        # turn nor take the attention factor (cos 1, sin 0), as transformers leaves those dims
        still = torch.zeros(max_pos, head_dim // 2 - rotary // 2)
        cos = torch.cat((freqs.cos() * attention_factor, still + 1), dim=-1)
        sin = torch.cat((freqs.sin() * attention_factor, still), dim=-1)
        self.cos: torch.Tensor  # [max_pos, D] (buffers: .to(device) moves them)
        self.sin: torch.Tensor
        self.register_buffer("cos", torch.cat((cos, cos), dim=-1), persistent=False)
        self.register_buffer("sin", torch.cat((sin, sin), dim=-1), persistent=False)


def partial_rotary_order(head_dim: int, rotary_dim: int) -> list[int]:
    """For each dimension slot of a head, the checkpoint's dimension it holds, so that partial
    rotary (transformers rotates dims [0, R) as pairs (i, i + R/2)) becomes full rotate-half
    rotary over pairs (j, j + D/2), with the pass-through dims [R, D) in slots turning at
    frequency 0. q and k get the same order, so every attention score is unchanged."""
    half, r = head_dim // 2, rotary_dim // 2
    passing = iter(range(rotary_dim, head_dim))
    first = list(range(r)) + [next(passing) for _ in range(half - r)]
    second = list(range(r, rotary_dim)) + [next(passing) for _ in range(half - r)]
    return first + second


def llama3_factors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                   high_freq_factor: float, original_max_position_embeddings: int) -> tuple[float, ...]:
    """Per-frequency divisors of Llama 3.1 scaling (what llama.cpp's converter writes as
    rope_freqs.weight): wavelengths shorter than original/high_freq_factor keep their frequency,
    longer than original/low_freq_factor are divided by `factor`, and those between blend
    the two (transformers' `_compute_llama3_parameters`, as a divisor)."""
    if high_freq_factor <= low_freq_factor:
        raise CorruptModelFile(f"llama3 RoPE scaling needs high_freq_factor ({high_freq_factor}) > "
                               f"low_freq_factor ({low_freq_factor}); fix rope_scaling in config.json")
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    out = []
    for inv in inv_frequencies(head_dim, theta).tolist():
        wavelen = 2 * math.pi / inv
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(float(factor))
        else:
            smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(out)


def yarn_factors(head_dim: int, theta: float, factor: float, original: int, beta_fast: float = 32.0,
                 beta_slow: float = 1.0, truncate: bool = True) -> tuple[float, ...]:
    """Per-frequency divisors of YaRN (transformers' `_compute_yarn_parameters`, as a divisor of
    the unscaled frequency): frequencies turning more than beta_fast times over the original
    context keep their value, fewer than beta_slow times are divided by `factor`, a linear ramp
    over the dimensions between."""
    def dim_of(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    inv = inv_frequencies(head_dim, theta)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp  # 1: extrapolate (the frequency as trained), 0: interpolate (divided by factor)
    scaled = (inv / factor) * (1 - keep) + inv * keep
    return tuple((inv / scaled).tolist())


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    return get(factor, mscale) / get(factor, mscale_all_dim) if mscale and mscale_all_dim else get(factor)


def rope_from_hf(rope: dict[str, Any], head_dim: int, theta: float,
                 max_pos: int) -> tuple[tuple[float, ...] | None, float]:
    """(factors, attention factor) for a config.json `rope_parameters` (v5) / `rope_scaling` (v4) dict."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in HF_ROPE_TYPES:
        raise UnsupportedModel(f"RoPE scaling {kind!r} is not implemented (supported: {', '.join(HF_ROPE_TYPES)})")
    try:
        if kind == "linear":
            return (float(rope["factor"]),) * (head_dim // 2), 1.0
        if kind == "llama3":
            return llama3_factors(head_dim, theta, float(rope["factor"]), float(rope["low_freq_factor"]),
                                  float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"])), 1.0
        if kind == "yarn":
            original = int(rope.get("original_max_position_embeddings") or max_pos)
            factor = float(rope.get("factor") or max_pos / original)
            attention = rope.get("attention_factor")
            attention = float(attention) if attention is not None else yarn_attention_factor(
                factor, rope.get("mscale"), rope.get("mscale_all_dim"))
            return yarn_factors(head_dim, theta, factor, original, float(rope.get("beta_fast") or 32),
                                float(rope.get("beta_slow") or 1), bool(rope.get("truncate", True))), attention
        if kind == "longrope":
            return _longrope(rope, head_dim, max_pos)
    except KeyError as exc:
        raise CorruptModelFile(f"{kind} RoPE scaling in config.json lacks {exc}; re-save the model") from exc
    return None, 1.0  # default, and dynamic NTK within max_position_embeddings


def _longrope(rope: dict[str, Any], head_dim: int, max_pos: int) -> tuple[tuple[float, ...], float]:
    original = int(rope["original_max_position_embeddings"])
    factors = rope["long_factor"] if max_pos > original else rope["short_factor"]
    if len(factors) != head_dim // 2:
        raise CorruptModelFile(f"long-RoPE factors have {len(factors)} values, expected head_dim/2 = {head_dim // 2}")
    factor = float(rope.get("factor") or max_pos / original)
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return tuple(float(f) for f in factors), float(attention)


def rope_from_gguf(meta: dict[str, Any], arch: str, rotary_dim: int, theta: float,
                   rope_freqs: Sequence[float] | None,
                   longrope: dict[str, list[float]] | None = None) -> tuple[tuple[float, ...] | None, float]:
    """(factors, attention factor) from a GGUF's `rope_freqs.weight` values, Phi-3's
    `rope_factors_long/short` values (`longrope`) and/or `{arch}.rope.scaling.*` keys (llama.cpp
    multiplies rope_freqs and a linear factor). `rotary_dim`: `{arch}.rope.dimension_count`."""
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in ("none", "linear", "yarn"):
        raise UnsupportedModel(f"GGUF RoPE scaling {kind!r} is not implemented (supported: none, linear, yarn, "
                               "llama3 factors in rope_freqs.weight, Phi-3's rope_factors_long/short)")
    factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    named = {"rope_freqs.weight": rope_freqs, **{f"rope_factors_{k}.weight": v for k, v in (longrope or {}).items()}}
    for name, values in named.items():
        if values is not None and len(values) != rotary_dim // 2:
            raise CorruptModelFile(f"{name} has {len(values)} values, expected rotary dims / 2 = "
                                   f"{rotary_dim // 2}; the file is damaged or for another model")
    if longrope:  # as llama.cpp: the long factors when the context is past the original one
        context = int(meta.get(f"{arch}.context_length", 0))
        original = int(meta.get(f"{arch}.rope.scaling.original_context_length") or context)
        attention = meta.get(f"{arch}.rope.scaling.attn_factor")
        attention = float(attention) if attention else (
            1.0 if context <= original else math.sqrt(1 + math.log(context / original) / math.log(original)))
        return tuple(longrope["long"] if context > original else longrope["short"]), attention
    if kind == "yarn":
        original = int(meta.get(f"{arch}.rope.scaling.original_context_length") or meta[f"{arch}.context_length"])
        attention = meta.get(f"{arch}.rope.scaling.attn_factor")
        attention = float(attention) if attention else yarn_attention_factor(factor)
        return yarn_factors(rotary_dim, theta, factor, original), attention
    linear = factor if kind == "linear" else 1.0
    if rope_freqs is None and linear == 1.0:
        return None, 1.0
    return tuple(float(f) * linear for f in (rope_freqs or (1.0,) * (rotary_dim // 2))), 1.0
