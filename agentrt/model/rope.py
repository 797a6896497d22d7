"""Rotary position embedding: the cos/sin tables, and RoPE scaling read from either format.

Scaling is kept in one form, llama.cpp's: a divisor per rotary frequency (`rope_freqs.weight`,
head_dim/2 values), so frequency i turns at base^(-2i/D) / factors[i] radians per position.

    Hugging Face rope_type   GGUF                                      factors
    "default"                (nothing)                                 None
    "linear" (factor f)      {arch}.rope.scaling.type="linear", .factor  f for every i
    "llama3"                 rope_freqs.weight (llama.cpp's converter   1 above the high-frequency
                             computes it from the four parameters)      cut, f below the low one,
                                                                        smoothed in between

A GGUF keeps only the factors (llama.cpp's converter does not write the llama3 parameters,
and transformers' GGUF loader ignores rope_freqs), so both sources end as the same table.
Not implemented (UnsupportedModel): "dynamic", "yarn", "longrope" and other types,
partial rotary (rope.dimension_count / partial_rotary_factor below head_dim), and YaRN's
attention factor.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import torch
from torch import nn

from agentrt.errors import CorruptModelFile, UnsupportedModel

HF_ROPE_TYPES = ("default", "linear", "llama3")


def inv_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] fp32 inverse frequencies, computed as transformers does (so tables match bit for bit)."""
    return 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


class RopeTable(nn.Module):
    """cos/sin tables [max_pos, D] in fp32 (HF rotate-half layout); `factors` divide the
    frequencies (RoPE scaling, see the module docstring)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float, factors: Sequence[float] | None = None):
        super().__init__()
        inv = inv_frequencies(head_dim, theta)
        if factors is not None:
            inv = inv / torch.tensor(factors, dtype=torch.float32)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)


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


def factors_from_hf(rope: dict[str, Any], head_dim: int, theta: float) -> tuple[float, ...] | None:
    """Factors for a config.json `rope_parameters` (v5) / `rope_scaling` (v4) dict."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in HF_ROPE_TYPES:
        raise UnsupportedModel(f"RoPE scaling {kind!r} is not implemented (supported: {', '.join(HF_ROPE_TYPES)})")
    if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModel("partial rotary embeddings (partial_rotary_factor < 1) are not implemented")
    try:
        if kind == "linear":
            return (float(rope["factor"]),) * (head_dim // 2)
        if kind == "llama3":
            return llama3_factors(head_dim, theta, float(rope["factor"]), float(rope["low_freq_factor"]),
                                  float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"]))
    except KeyError as exc:
        raise CorruptModelFile(f"{kind} RoPE scaling in config.json lacks {exc}; re-save the model") from exc
    return None


def factors_from_gguf(meta: dict[str, Any], arch: str, head_dim: int,
                      rope_freqs: Sequence[float] | None) -> tuple[float, ...] | None:
    """Factors from a GGUF's `rope_freqs.weight` values and/or `{arch}.rope.scaling.*` keys
    (llama.cpp multiplies the two)."""
    dims = meta.get(f"{arch}.rope.dimension_count")
    if dims is not None and int(dims) != head_dim:
        raise UnsupportedModel(f"partial rotary embeddings ({arch}.rope.dimension_count={dims} < head_dim "
                               f"{head_dim}) are not implemented")
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in ("none", "linear"):
        raise UnsupportedModel(f"GGUF RoPE scaling {kind!r} is not implemented (supported: none, linear, "
                               "and llama3 factors in rope_freqs.weight)")
    linear = float(meta.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0) if kind == "linear" else 1.0
    if rope_freqs is not None and len(rope_freqs) != head_dim // 2:
        raise CorruptModelFile(f"rope_freqs.weight has {len(rope_freqs)} values, expected head_dim/2 = "
                               f"{head_dim // 2}; the file is damaged or for another model")
    if rope_freqs is None and linear == 1.0:
        return None
    return tuple(float(f) * linear for f in (rope_freqs or (1.0,) * (head_dim // 2)))
