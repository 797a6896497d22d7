"""Paged attention token by token, split across programs (flash-decoding), in triton.

Every query token t of a short row (a decode token, a draft being verified, a fast-forwarded run,
a small prefill chunk: rows of up to base.SHORT_QUERIES tokens) attends the keys of its own
sequence up to its own position: kv_len[t] = position + 1 (its row's keys are stored first), the
last `window` of them with a sliding window. So one launch serves a whole mixed batch's short
rows, causal within each row, with no per-row host loop.

    pass 1  grid (T, Hkv, SPLITS): a program takes one token, one KV head with its GROUP query
            heads (GQA: each key is read once per group) and 1/SPLITS of the token's keys, in
            blocks of whole pages; it writes a partial softmax (m, l, acc) per query head
    pass 2  grid (T * H): the SPLITS partials fold into the output (empty splits weigh 0)

Products are elementwise multiply + sum in fp32 (no tl.dot: one to four query rows per program,
and the interpreter's bf16 tl.dot is wrong, see triton_ops.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _partial(q_ptr, kc_ptr, vc_ptr, part_ptr, table_ptr, seq_ptr, lens_ptr, scale, softcap, window,
             table_stride, n_kv_heads, fixed_chunk, GROUP: tl.constexpr, GP: tl.constexpr, HEAD: tl.constexpr,
             DP: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
             SOFTCAP: tl.constexpr):
    # q: [T, H, HEAD]; caches: [P, PAGE, Hkv, HEAD]; table: [B, table_stride]; seq, lens: [T]
    # part: [T, H, SPLITS, DP + 2] fp32 (acc, then m, then l)
    t, kvh, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq = tl.load(seq_ptr + t).to(tl.int64)
    kv_len = tl.load(lens_ptr + t)
    lo = kv_len * 0
    if window > 0:
        lo = tl.maximum(kv_len - window, 0)
    chunk = tl.cdiv(tl.cdiv(kv_len - lo, SPLITS), BLOCK) * BLOCK
    if fixed_chunk > 0:  # (batch-invariant: a token's splits depend on its own keys only)
        chunk = fixed_chunk + kv_len * 0
    start = lo + s * chunk
    end = tl.minimum(kv_len, start + chunk)
    g = tl.arange(0, GP)
    d = tl.arange(0, DP)
    gm, dm = g < GROUP, d < HEAD
    h = kvh * GROUP + g  # [GP] query heads of this KV head
    q = tl.load(q_ptr + (t * n_kv_heads * GROUP + h)[:, None] * HEAD + d[None, :],
                mask=gm[:, None] & dm[None, :], other=0.0).to(tl.float32)  # [GP, DP]
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], tl.float32)
    acc = tl.zeros([GP, DP], tl.float32)
    n = tl.arange(0, BLOCK)
    for kb in range(start, end, BLOCK):
        pos = kb + n  # [BLOCK] absolute key positions
        valid = pos < end
        page = tl.load(table_ptr + seq * table_stride + pos // PAGE, mask=valid, other=0).to(tl.int64)
        rows = (page * PAGE + pos % PAGE) * n_kv_heads + kvh
        kv_mask = valid[:, None] & dm[None, :]
        k = tl.load(kc_ptr + rows[:, None] * HEAD + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        sc = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [GP, BLOCK]
        if SOFTCAP:  # softcap * tanh(sc / softcap), tanh(x) = (e^2x - 1) / (e^2x + 1), |x| <= 15
            e = tl.exp(2.0 * tl.minimum(tl.maximum(sc / softcap, -15.0), 15.0))
            sc = softcap * (e - 1.0) / (e + 1.0)
        sc = tl.where(valid[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(vc_ptr + rows[:, None] * HEAD + d[None, :], mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    base = ((t * n_kv_heads * GROUP + h) * SPLITS + s) * (DP + 2)  # [GP]
    tl.store(part_ptr + base[:, None] + d[None, :], acc, mask=gm[:, None])
    tl.store(part_ptr + base + DP, m_i, mask=gm)
    tl.store(part_ptr + base + DP + 1, l_i, mask=gm)


@triton.jit
def _fold(part_ptr, out_ptr, HEAD: tl.constexpr, DP: tl.constexpr, SPLITS: tl.constexpr):
    th = tl.program_id(0)  # token * H + head
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, DP)
    base = (th * SPLITS + s) * (DP + 2)
    m = tl.load(part_ptr + base + DP)
    denom = tl.load(part_ptr + base + DP + 1)  # each split's softmax sum
    acc = tl.load(part_ptr + base[:, None] + d[None, :])
    top = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(denom * w, axis=0)
    tl.store(out_ptr + th * HEAD + d, o, mask=d < HEAD)


@triton.jit
def _fold_in_order(part_ptr, lens_ptr, out_ptr, window, chunk, H, HEAD: tl.constexpr, DP: tl.constexpr,
                   SPLITS: tl.constexpr):
    # the batch-invariant fold: a token's own splits (ceil(keys / chunk)), added one by one in order
    th = tl.program_id(0)
    kv_len = tl.load(lens_ptr + th // H)
    lo = kv_len * 0
    if window > 0:
        lo = tl.maximum(kv_len - window, 0)
    n = tl.cdiv(kv_len - lo, chunk)
    d = tl.arange(0, DP)
    top = tl.load(part_ptr + th * SPLITS * (DP + 2) + DP)
    for s in range(1, n):
        top = tl.maximum(top, tl.load(part_ptr + (th * SPLITS + s) * (DP + 2) + DP))
    o = tl.zeros([DP], tl.float32)
    den = top * 0.0
    for s in range(0, n):
        base = (th * SPLITS + s) * (DP + 2)
        w = tl.exp(tl.load(part_ptr + base + DP) - top)
        o = o + tl.load(part_ptr + base + d) * w
        den = den + tl.load(part_ptr + base + DP + 1) * w
    tl.store(out_ptr + th * HEAD + d, o / den, mask=d < HEAD)


def invariant_chunk(max_context: int, block: int = 64) -> int:
    """Keys per split in the batch-invariant mode: fixed per model (at most 32 splits at its
    longest context), whole multiples of any BLOCK (<= 64)."""
    return max(256, triton.next_power_of_2(-(-max_context // 32)), block)


def splits_for(n_tokens: int, n_kv_heads: int, max_kv: int, block: int) -> int:
    """Programs per token: enough (token, KV head) x split programs to fill a GPU (~256), and
    no more splits than the longest key run has blocks. A power of two (pass 2's tile)."""
    want = max(1, min(-(-256 // max(1, n_tokens * n_kv_heads)), -(-max(1, max_kv) // block), 32))
    return 1 << (want - 1).bit_length()


def block_for(group_p: int, dp: int) -> int:
    """Keys per inner step: whole pages, at most 8192 fp32 products [GP, BLOCK, DP] in flight."""
    return max(16, min(64, 8192 // (group_p * dp)))


def token_attention(q, k_cache, v_cache, page_table, seq, lens, scale: float, window: int = 0,
                    softcap: float = 0.0, max_kv: int = 0, chunk: int = 0) -> torch.Tensor:
    """q [T, H, D] -> [T, H, D]: token t over the pages page_table[seq[t]] up to lens[t] keys.
    `max_kv`: the longest lens (a host int, for the split count; 0: unknown, split widely).
    `chunk` > 0 (invariant_chunk): every token's keys split in runs of `chunk`, folded in
    order, so its output does not depend on the other tokens of the launch (0: splits by load)."""
    t, h, d = q.shape
    page, hkv = k_cache.shape[1], k_cache.shape[2]
    group = h // hkv
    gp, dp = triton.next_power_of_2(group), triton.next_power_of_2(d)
    block = block_for(gp, dp)
    splits = splits_for(t, hkv, max_kv or 1 << 20, block) if not chunk else max(1, -(-(max_kv or chunk) // chunk))
    part = torch.empty((t, h, splits, dp + 2), dtype=torch.float32, device=q.device)
    table = page_table.contiguous()
    _partial[(t, hkv, splits)](q.contiguous(), k_cache, v_cache, part, table, seq.contiguous(), lens.contiguous(),
                               scale, float(softcap), int(window), table.stride(0), hkv, int(chunk), GROUP=group, GP=gp,
                               HEAD=d, DP=dp, PAGE=page, BLOCK=block, SPLITS=splits, SOFTCAP=bool(softcap))
    out = torch.empty((t, h, d), dtype=torch.float32, device=q.device)
    if chunk:
        _fold_in_order[(t * h,)](part, lens.contiguous(), out, int(window), int(chunk), h, HEAD=d, DP=dp, SPLITS=splits)
    else:
        _fold[(t * h,)](part, out, HEAD=d, DP=dp, SPLITS=splits)
    return out.to(q.dtype)
