"""Pure-torch kernels: the CPU path and the oracle every triton kernel is tested against."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from agentrt.kernels import native
from agentrt.kernels.base import AttentionMeta

KV_GROUP = 32  # an int8 KV row: D int8 values, then a float32 scale per group of 32 of them


def kv_groups(head_dim: int) -> int:
    return -(-head_dim // KV_GROUP)


def quantize_kv(x: torch.Tensor) -> torch.Tensor:
    """[..., D] float -> [..., D + 4 * kv_groups(D)] int8: each group of 32 values / (its
    amax / 127), rounded to nearest even, then the groups' amax / 127 as float32 bytes (the
    compiled store's arithmetic, csrc/ops.cpp)."""
    x, qs, ds = x.float(), [], []
    for a in range(0, x.shape[-1], KV_GROUP):
        g = x[..., a:a + KV_GROUP]
        d = g.abs().amax(-1, keepdim=True) / 127.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        qs.append(torch.round(g * inv).clamp(-127, 127).to(torch.int8))
        ds.append(d)
    return torch.cat([*qs, torch.cat(ds, -1).contiguous().view(torch.int8)], -1)


@functools.lru_cache(maxsize=16)
def _head_dim(width: int) -> int:
    """The D of an int8 row `width` elements wide (width grows with D: one answer)."""
    return next(d for d in range(width, 0, -1) if d + 4 * kv_groups(d) == width)


def dequantize_kv(rows: torch.Tensor) -> torch.Tensor:
    """[..., D + 4 * kv_groups(D)] int8 rows -> [..., D] float32."""
    dim = _head_dim(rows.shape[-1])
    d = rows[..., dim:].contiguous().view(torch.float32).repeat_interleave(KV_GROUP, -1)[..., :dim]
    return rows[..., :dim].float() * d


def store_kv(k_cache, v_cache, k, v, slot_mapping) -> None:
    # caches: [P, S, Hkv, D] viewed as [P*S, Hkv, D]; k, v: [T, Hkv, D]; slot_mapping: [T]
    enc = quantize_kv if k_cache.dtype == torch.int8 else (lambda x: x.to(k_cache.dtype))
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, enc(k))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, enc(v))


def gather_pages(cache: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """cache [P, S, Hkv, D], pages [..., n] -> [..., Hkv, n*S, D] (heads-major for SDPA); an
    int8 store's rows come back as float32."""
    g = cache[pages]  # [..., n, S, Hkv, D]
    if g.dtype == torch.int8:
        g = dequantize_kv(g)
    g = g.flatten(-4, -3)  # [..., n*S, Hkv, D]
    return g.transpose(-3, -2)


def attend(q, k, v, mask, scale, softcap: float = 0.0):
    """Grouped-query attention by explicit matmuls (fast at small sizes on CPU, where the
    fused SDPA kernel has a large fixed cost). q [..., H, Lq, D]; k, v [..., Hkv, L, D];
    mask bool, broadcastable to [..., H, Lq, L]; returns [..., H, Lq, D]. softcap > 0: scores
    become softcap * tanh(scores / softcap) (Gemma 2)."""
    h, hkv = q.shape[-3], k.shape[-3]
    if h != hkv:  # [.., Hkv, G*Lq, D]: each kv head serves G query heads
        g, lq = h // hkv, q.shape[-2]
        qg = q.reshape(*q.shape[:-3], hkv, g * lq, q.shape[-1])
        m = mask.expand(*mask.shape[:-3], h, lq, mask.shape[-1]) if mask.dim() >= 3 else mask
        m = m.reshape(*m.shape[:-3], hkv, g * lq, m.shape[-1]) if mask.dim() >= 3 else mask
        out = attend(qg, k, v, m, scale, softcap)
        return out.reshape(q.shape)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


SDPA_MIN_QUERIES = 48  # from this many queries on, the fused kernel wins (bench: 250 queries over 2300 keys 42 -> 15 ms)


def decode_mask(meta: AttentionMeta, window: int = 0) -> torch.Tensor:
    """[Bd, 1, 1, max_kv] keys each decode row attends (on the metadata's device): its KV, and
    with window > 0 only the last `window` of it (the query sits at kv_len - 1)."""
    lens = meta.decode_lens  # [Bd]
    cols = torch.arange(meta.decode_max_kv, device=lens.device)
    keep = cols < lens[:, None]
    if window:
        keep &= cols >= (lens - window)[:, None]
    return keep[:, None, None, :]


def _decode_attention(q, k_cache, v_cache, meta: AttentionMeta, scale, window: int = 0, softcap: float = 0.0):
    # q: [Bd, H, D] one query per sequence, all batched with a key-padding mask.
    keep = decode_mask(meta, window)  # [Bd, 1, 1, max_kv]
    max_kv = meta.decode_max_kv
    pages = meta.page_table[meta.decode_idx, : -(-max_kv // meta.page_size)]  # [Bd, n]
    k = gather_pages(k_cache, pages)[:, :, :max_kv]  # [Bd, Hkv, max_kv, D]
    v = gather_pages(v_cache, pages)[:, :, :max_kv]
    ct = torch.promote_types(q.dtype, k.dtype)  # (a float16 KV store is read in float32)
    out = attend(q.unsqueeze(2).to(ct), k.to(ct), v.to(ct), keep, scale, softcap)
    return out.squeeze(2)  # [Bd, H, D]


def _prefill_attention(q, k_cache, v_cache, kv_len, pages, scale, window: int = 0, softcap: float = 0.0):
    # q: [H, Lq, D] the last Lq positions of a kv_len-long sequence
    n_pages = -(-kv_len // k_cache.shape[1])
    k = gather_pages(k_cache, pages[:n_pages])[:, :kv_len]  # [Hkv, kv_len, D]
    v = gather_pages(v_cache, pages[:n_pages])[:, :kv_len]
    ct = torch.promote_types(q.dtype, k.dtype)  # (a float16 KV store is read in float32)
    k, v = k.to(ct), v.to(ct)
    lq = q.shape[1]
    cols = torch.arange(kv_len, device=q.device).unsqueeze(0)  # (masks are made where the queries are)
    qpos = cols[:, kv_len - lq:].T  # [Lq, 1]
    mask = cols <= qpos  # [Lq, kv_len]
    if window:
        mask &= cols > qpos - window
    if lq < SDPA_MIN_QUERIES or softcap:  # (SDPA has no softcap)
        return attend(q.to(k.dtype), k, v, mask[None], scale, softcap)
    # long chunks: the fused (flash) CPU kernel, which torch only picks for 4-D inputs with
    # equal head counts (enable_gqa falls back to the slow math path), so kv heads repeat
    g = q.shape[0] // k.shape[0]
    k4, v4 = k.repeat_interleave(g, 0)[None], v.repeat_interleave(g, 0)[None]
    q4 = q.to(k.dtype)[None]
    if lq == kv_len and not window:
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)[0]
    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=scale)[0]


def paged_attention(q, k_cache, v_cache, meta: AttentionMeta, scale: float, window: int = 0,
                    softcap: float = 0.0) -> torch.Tensor:
    out = paged_attention_rows(q, k_cache, v_cache, meta, scale, meta.prefill_rows, window, softcap)
    if meta.decode_rows:
        tok = meta.decode_tok
        out[tok] = _decode_attention(q[tok], k_cache, v_cache, meta, scale, window, softcap).to(out.dtype)
    return out


def paged_attention_rows(q, k_cache, v_cache, meta: AttentionMeta, scale: float, rows,
                         window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Attention for the sequences in `rows` one by one; other rows of the result are unset.
    window > 0: each query attends only its last `window` keys."""
    out = torch.empty_like(q)  # [T, H, D]
    for r in rows:
        a, b = meta.cu_q[r], meta.cu_q[r + 1]
        res = _prefill_attention(q[a:b].transpose(0, 1), k_cache, v_cache, meta.kv_lens[r],
                                 meta.page_table[r], scale, window, softcap)
        out[a:b] = res.transpose(0, 1).to(out.dtype)
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:  # one fused op; same math as below
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, H, D]; cos, sin: [T, D] (the two halves repeat the same frequencies)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)


class TorchBackend:
    """Reference kernels as a backend object (see base.KernelBackend); its argmax takes the
    compiled CPU kernel when the library is loaded (the same result as torch.argmax)."""

    name = "torch"
    invariant_chunk = 0  # (the torch reference has no split to fix: base.KernelBackend)
    store_kv = staticmethod(store_kv)
    paged_attention = staticmethod(paged_attention)
    argmax = staticmethod(native.argmax)
    rms_norm = staticmethod(rms_norm)
    rope = staticmethod(rope)
