"""Triton kernels (CUDA; also runnable by triton's CPU interpreter with TRITON_INTERPRET=1,
which is how CI checks them against reference.py). Products are formed in fp32 with
elementwise multiply + sum rather than tl.dot: the triton 3.9 interpreter computes bf16
tl.dot wrongly, and for one query row per program a dot brings nothing."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrt.kernels import reference
from agentrt.kernels.base import AttentionMeta
from agentrt.kernels.triton_attention import token_attention


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    # one program per row; running (max, index) over BLOCK-wide column tiles
    row = tl.program_id(0)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 0, tl.int64)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        better = v > best_v
        best_v = tl.where(better, v, best_v)
        best_i = tl.where(better, cols.to(tl.int64), best_i)
    m = tl.max(best_v, axis=0)
    # the smallest index attaining the max (torch.argmax's tie rule)
    cand = tl.where(best_v == m, best_i, n_cols)
    tl.store(out_ptr + row, tl.min(cand, axis=0))


def argmax(logits: torch.Tensor) -> torch.Tensor:
    x = logits.contiguous()
    out = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _argmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=1024)
    return out


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slots_ptr, width, BLOCK: tl.constexpr):
    # one program per new token: copy its [Hkv * D] row into the cache row `slot`
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    for start in range(0, width, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < width
        tl.store(kc_ptr + slot * width + offs, tl.load(k_ptr + t * width + offs, mask=m), mask=m)
        tl.store(vc_ptr + slot * width + offs, tl.load(v_ptr + t * width + offs, mask=m), mask=m)


def store_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    width = k.shape[1] * k.shape[2]
    k = k.to(k_cache.dtype).contiguous()
    v = v.to(v_cache.dtype).contiguous()
    _store_kv_kernel[(k.shape[0],)](k, v, k_cache, v_cache, slot_mapping, width, BLOCK=128)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, n, eps, BLOCK: tl.constexpr, ROUND: tl.constexpr):
    # one program per row: x * rsqrt(mean(x^2) + eps) in fp32, rounded to x's dtype (ROUND), times w
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=m, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    if ROUND:  # (the reference rounds the normalized row before the weight multiplies it)
        y = y.to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n + cols, (y * w).to(out_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in one launch (reference.rms_norm's arithmetic)."""
    xc = x.contiguous()
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    rows = xc.numel() // n
    if rows:
        _rms_norm_kernel[(rows,)](xc, weight, out, n, eps, BLOCK=triton.next_power_of_2(n),
                                  ROUND=x.dtype != torch.float32)
    return out


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, heads, D: tl.constexpr, HALF: tl.constexpr):
    # one program per (token, head): x * cos + rotate_half(x) * sin in fp32, one rounding
    t, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    i = tl.arange(0, HALF)
    base = (t * heads + h) * D
    x1 = tl.load(x_ptr + base + i).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + i).to(tl.float32)
    c1, c2 = tl.load(cos_ptr + t * D + i), tl.load(cos_ptr + t * D + HALF + i)
    s1, s2 = tl.load(sin_ptr + t * D + i), tl.load(sin_ptr + t * D + HALF + i)
    tl.store(out_ptr + base + i, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty))
    tl.store(out_ptr + base + HALF + i, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [T, H, D] with cos/sin [T, D] in one launch (a power-of-two half;
    other head dims take the reference)."""
    t, h, d = x.shape
    half = d // 2
    if d % 2 or half & (half - 1) or cos.dtype != torch.float32:
        return reference.rope(x, cos, sin)
    out = torch.empty_like(x)
    if t:
        _rope_kernel[(t, h)](x.contiguous(), cos.contiguous(), sin.contiguous(), out, h, D=d, HALF=half)
    return out


def paged_attention(q, k_cache, v_cache, meta: AttentionMeta, scale: float, window: int = 0,
                    softcap: float = 0.0, chunk: int = 0) -> torch.Tensor:
    """Every token of the short rows (decode, verification, small chunks) in one launch
    (triton_attention.token_attention: causal per token, window and softcap included); long
    prefill rows one by one through the reference (SDPA). `chunk` > 0: the batch-invariant split
    (a batch built with every row short, as the invariant mode builds them)."""
    out = reference.paged_attention_rows(q, k_cache, v_cache, meta, scale, meta.long_rows, window, softcap)
    if meta.short_max_kv:
        tok = meta.short_tok
        out[tok] = token_attention(q[tok], k_cache, v_cache, meta.page_table, meta.short_seq, meta.short_lens,
                                   scale, window, softcap, meta.short_max_kv, chunk)
    return out


class TritonBackend:
    """`invariant_chunk` > 0 (model/device_quant.place, batch-invariant loads): every token's
    attention splits its keys in runs of that many, whatever else the step holds."""

    name = "triton"
    store_kv = staticmethod(store_kv)
    argmax = staticmethod(argmax)
    rms_norm = staticmethod(rms_norm)
    rope = staticmethod(rope)

    def __init__(self) -> None:
        self.invariant_chunk = 0

    def paged_attention(self, q, k_cache, v_cache, meta: AttentionMeta, scale: float, window: int = 0,
                        softcap: float = 0.0) -> torch.Tensor:
        return paged_attention(q, k_cache, v_cache, meta, scale, window, softcap, self.invariant_chunk)
