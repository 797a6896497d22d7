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
def _decode_attn_kernel(q_ptr, kc_ptr, vc_ptr, out_ptr, table_ptr, lens_ptr, scale,
                        table_stride, n_kv_heads, group, HEAD: tl.constexpr, PAGE: tl.constexpr):
    # one program per (sequence, query head); online softmax over the sequence's pages.
    # q, out: [B, H, D]; caches: [P, PAGE, Hkv, D]; table: [B, max_pages]; lens: [B]
    b, h = tl.program_id(0), tl.program_id(1)
    kvh = h // group
    d = tl.arange(0, HEAD)
    q = tl.load(q_ptr + (b * n_kv_heads * group + h) * HEAD + d).to(tl.float32)
    kv_len = tl.load(lens_ptr + b)
    m_i = tl.full([1], float("-inf"), tl.float32)
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([HEAD], tl.float32)
    pos = tl.arange(0, PAGE)
    for p in range(0, tl.cdiv(kv_len, PAGE)):
        page = tl.load(table_ptr + b * table_stride + p).to(tl.int64)
        rows = (page * PAGE + pos) * n_kv_heads + kvh  # [PAGE] row index of (slot, kv head)
        valid = p * PAGE + pos < kv_len
        k = tl.load(kc_ptr + rows[:, None] * HEAD + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        w = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(vc_ptr + rows[:, None] * HEAD + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        l_i = l_i * alpha + tl.sum(w, axis=0)
        m_i = m_new
    tl.store(out_ptr + (b * n_kv_heads * group + h) * HEAD + d, acc / l_i)


def decode_attention(q, k_cache, v_cache, page_table, kv_lens, scale) -> torch.Tensor:
    """q [B, H, D] one query per sequence -> [B, H, D] (fp32 accumulation, q's dtype out)."""
    b, h, d = q.shape
    hkv, page = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty((b, h, d), dtype=torch.float32, device=q.device)
    table = page_table.contiguous()
    _decode_attn_kernel[(b, h)](q.contiguous(), k_cache, v_cache, out, table, kv_lens.contiguous(),
                                scale, table.stride(0), hkv, h // hkv, HEAD=d, PAGE=page)
    return out.to(q.dtype)


def paged_attention(q, k_cache, v_cache, meta: AttentionMeta, scale: float, window: int = 0,
                    softcap: float = 0.0) -> torch.Tensor:
    """Decode rows by the triton kernel; prefill rows (several queries) by the reference (and
    every row of a sliding-window or softcapped layer: the triton kernel has neither)."""
    if window or softcap:
        return reference.paged_attention(q, k_cache, v_cache, meta, scale, window, softcap)
    out = reference.paged_attention_rows(q, k_cache, v_cache, meta, scale, meta.prefill_rows)
    if meta.decode_rows:
        tok = meta.decode_tok
        out[tok] = decode_attention(q[tok], k_cache, v_cache, meta.page_table[meta.decode_idx], meta.decode_lens, scale)
    return out


class TritonBackend:
    name = "triton"
    store_kv = staticmethod(store_kv)
    paged_attention = staticmethod(paged_attention)
    argmax = staticmethod(argmax)
    rms_norm = staticmethod(reference.rms_norm)
    rope = staticmethod(reference.rope)
