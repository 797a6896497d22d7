"""A GGUF's quantized weights on a GPU: one triton GEMM that dequantizes in registers.

A weight W [N, K] stays in the planes of `DevicePlanes` (model/device_quant.py builds them from the
file's blocks, about the file's own bytes):

    q      QBITS 4/5/6: `lo` uint8 [N, K/2], two low nibbles per byte (k even: the low one);
           5 and 6 bits add `hi` uint8 [N, K/8] (one bit each) or [N, K/4] (two bits each)
           QBITS 8: `lo` uint8 [N, K] (Q8_0 as int8 + 128); QBITS 16: `lo` is a dense [N, K]
           float matrix (the same kernel, batch-invariant, for bf16 weights)
    scale  TWO (Q4_K, Q5_K, Q6_K): sd fp16 [N, K/256] times sc [N, K/G] (uint8, Q6_K int8);
           else sc fp16 [N, K/G]
    min    MIN=2 (Q4_K, Q5_K): -(md fp16 [N, K/256] * mc uint8 [N, K/G]); MIN=1 (Q4_1, Q5_1):
           mc fp16 [N, K/G]; MIN=0: none

    w[n, k] = s[n, g] * (q[n, k] - Z) + m[n, g]   (g = k // G; each product in fp32, in
                                                   QuantMatrix.dequantize's order)

so the kernel's w equals the CPU dequantization of the same blocks (tests/test_triton_quant.py
checks every format in triton's interpreter).

Batch invariance: a program computes a [BM, BN] tile of out over K in BK steps, in a fixed order;
the tile sizes depend on the layer (N, K) and on `invariant`, never on M when `invariant` is set,
so a row's result does not depend on how many rows share its step (alone, batched, a prefill
chunk of any length): the same instructions reduce it. Without `invariant`, M > 16 takes wider
row tiles (prefill), which may round differently.

`DOT`: how a tile's products are summed. 2 (CUDA's default): bf16 tensor cores (tl.dot); 1: tl.dot
in fp32 ("ieee"); 0 (the interpreter's default): an fp32 multiply and tl.sum over BK. The
interpreter's bf16 tl.dot is wrong (triton 3.9, see triton_ops.py) and its fp32 tl.dot is a BLAS
call whose rounding depends on a row's place in the tile, so on CPU the kernel sums elementwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class Planes:
    """The tensors and constants the kernel reads for one packed matrix (see the module doc)."""

    lo: torch.Tensor
    hi: torch.Tensor | None
    sd: torch.Tensor | None
    sc: torch.Tensor | None
    md: torch.Tensor | None
    mc: torch.Tensor | None
    qbits: int
    group: int
    z: int
    n: int
    k: int

    @property
    def two_level(self) -> bool:
        return self.sd is not None

    @property
    def min_kind(self) -> int:
        return 0 if self.mc is None else (2 if self.md is not None else 1)


@triton.jit
def _dequant(lo_ptr, hi_ptr, sd_ptr, sc_ptr, md_ptr, mc_ptr, n, k, K, mask,
             Z: tl.constexpr, QBITS: tl.constexpr, G: tl.constexpr, TWO: tl.constexpr, MIN: tl.constexpr):
    # n, k: broadcastable int64 index tensors of the tile; returns w[n, k] in fp32 (0 where ~mask)
    if QBITS == 16:
        w = tl.load(lo_ptr + n * K + k, mask=mask, other=0.0).to(tl.float32)
    else:
        if QBITS == 8:
            q = tl.load(lo_ptr + n * K + k, mask=mask, other=0).to(tl.int32)
        else:
            byte = tl.load(lo_ptr + n * (K // 2) + k // 2, mask=mask, other=0).to(tl.int32)
            q = (byte >> ((k % 2) * 4).to(tl.int32)) & 15
            if QBITS == 5:
                hb = tl.load(hi_ptr + n * (K // 8) + k // 8, mask=mask, other=0).to(tl.int32)
                q = q | (((hb >> (k % 8).to(tl.int32)) & 1) << 4)
            if QBITS == 6:
                hb = tl.load(hi_ptr + n * (K // 4) + k // 4, mask=mask, other=0).to(tl.int32)
                q = q | (((hb >> ((k % 4) * 2).to(tl.int32)) & 3) << 4)
        g = n * (K // G) + k // G
        s = tl.load(sc_ptr + g, mask=mask, other=0).to(tl.float32)
        if TWO:
            s = tl.load(sd_ptr + n * (K // 256) + k // 256, mask=mask, other=0.0).to(tl.float32) * s
        w = s * (q - Z).to(tl.float32)
        if MIN == 1:
            w = w + tl.load(mc_ptr + g, mask=mask, other=0.0).to(tl.float32)
        if MIN == 2:
            dm = tl.load(md_ptr + n * (K // 256) + k // 256, mask=mask, other=0.0).to(tl.float32)
            w = w + -(dm * tl.load(mc_ptr + g, mask=mask, other=0).to(tl.float32))
    return w


@triton.jit
def _qmm_kernel(x_ptr, lo_ptr, hi_ptr, sd_ptr, sc_ptr, md_ptr, mc_ptr, bias_ptr, out_ptr,
                M, N, K, stride_x, stride_o, k_run,
                Z: tl.constexpr, QBITS: tl.constexpr, G: tl.constexpr, TWO: tl.constexpr, MIN: tl.constexpr,
                HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                DOT: tl.constexpr):
    # out[M, N] = x[M, K] @ W^T (+ bias); grid (cdiv(N, BN), cdiv(M, BM), splits): split s sums
    # k in [s * k_run, (s + 1) * k_run) into out + s * M * stride_o (the partials, then _fold)
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    rn = (pid_n * BN + tl.arange(0, BN)).to(tl.int64)
    rk = tl.arange(0, BK).to(tl.int64)
    acc = tl.zeros([BM, BN], tl.float32)
    out_ptr += pid_k.to(tl.int64) * M * stride_o
    for k0 in range(pid_k * k_run, tl.minimum(K, (pid_k + 1) * k_run), BK):
        kk = k0 + rk
        xm = (rm[:, None] < M) & (kk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_x + kk[None, :], mask=xm, other=0.0).to(tl.float32)
        wm = (kk[:, None] < K) & (rn[None, :] < N)
        w = _dequant(lo_ptr, hi_ptr, sd_ptr, sc_ptr, md_ptr, mc_ptr, rn[None, :], kk[:, None], K, wm,
                     Z, QBITS, G, TWO, MIN)  # [BK, BN]
        if DOT == 2:
            acc = tl.dot(x.to(tl.bfloat16), w.to(tl.bfloat16), acc)
        elif DOT == 1:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc += tl.sum(x[:, :, None] * w[None, :, :], axis=1)
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    om = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * stride_o + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=om)


@triton.jit
def _fold(ws_ptr, bias_ptr, out_ptr, M, N, stride_o, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
          BLOCK: tl.constexpr):
    # out[m, n] = sum over splits in order of ws[s, m, n] (+ bias); grid (M, cdiv(N, BLOCK))
    m, nb = tl.program_id(0).to(tl.int64), tl.program_id(1)
    n = nb * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(SPLITS):
        acc += tl.load(ws_ptr + (s * M + m) * N + n, mask=n < N, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_o + n, acc.to(out_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _rows_kernel(ids_ptr, lo_ptr, hi_ptr, sd_ptr, sc_ptr, md_ptr, mc_ptr, out_ptr, K,
                 Z: tl.constexpr, QBITS: tl.constexpr, G: tl.constexpr, TWO: tl.constexpr, MIN: tl.constexpr,
                 BK: tl.constexpr):
    # out[t, :] = W[ids[t], :] (a quantized embedding's lookup); grid (T, cdiv(K, BK))
    t, kb = tl.program_id(0), tl.program_id(1)
    n = tl.load(ids_ptr + t).to(tl.int64)
    k = (kb * BK + tl.arange(0, BK)).to(tl.int64)
    w = _dequant(lo_ptr, hi_ptr, sd_ptr, sc_ptr, md_ptr, mc_ptr, n, k, K, k < K, Z, QBITS, G, TWO, MIN)
    tl.store(out_ptr + t.to(tl.int64) * K + k, w.to(out_ptr.dtype.element_ty), mask=k < K)


PROGRAMS = 512  # column x split programs a decode GEMM aims for (about 4 per SM of an H100/H200)


def tiles(p: Planes, m: int, invariant: bool) -> tuple[int, int, int, int]:
    """(BM, BN, BK, splits) for `m` rows of x. BN, BK and the K splits come from the layer
    only: a narrow layer's weights are read by PROGRAMS programs at once, each over a run of K,
    the partial sums folded in order (a decode row alone keeps the GPU's memory busy). BM is 16
    for decode rows (tl.dot's least) and, unless `invariant`, 64 for prefill rows, which then
    need no split."""
    bk = next(b for b in (128, 64, 32, 16) if p.k % b == 0 or b == 16)
    bn = 32 if p.n <= 8192 else 64  # (more column programs for the narrow layers of a decode step)
    steps = triton.cdiv(p.k, bk)
    splits = 1
    while splits * 2 * triton.cdiv(p.n, bn) <= PROGRAMS and steps // (splits * 2) >= 4:
        splits *= 2
    if not invariant and m > 16:
        return 64, bn, bk, 1
    return 16, bn, bk, splits


def _args(p: Planes):
    dummy = p.lo
    return (p.lo, p.hi if p.hi is not None else dummy, p.sd if p.sd is not None else dummy,
            p.sc if p.sc is not None else dummy, p.md if p.md is not None else dummy,
            p.mc if p.mc is not None else dummy)


def _consts(p: Planes) -> dict:
    return dict(Z=p.z, QBITS=p.qbits, G=p.group, TWO=p.two_level, MIN=p.min_kind)


def matmul(x: torch.Tensor, p: Planes, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           invariant: bool = True, dot: int | None = None) -> torch.Tensor:
    """out[:, :N] = x [M, K] @ W^T (+ bias), in x's dtype unless `out` is given (`out` may be a
    column slice of a wider row-major buffer: fused projections write side by side)."""
    x2 = x.reshape(-1, p.k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if out is None:
        out = torch.empty(m, p.n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, bk, splits = tiles(p, m, invariant)
    dot = (2 if x.is_cuda else 0) if dot is None else dot
    k_run = triton.cdiv(triton.cdiv(p.k, bk), splits) * bk
    ws = out if splits == 1 else torch.empty(splits, m, p.n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(p.n, bn), triton.cdiv(m, bm), splits)
    _qmm_kernel[grid](x2, *_args(p), bias if bias is not None else p.lo, ws, m, p.n, p.k, x2.stride(0),
                      ws.stride(-2), k_run, **_consts(p), HAS_BIAS=bias is not None and splits == 1, BM=bm, BN=bn,
                      BK=bk, DOT=dot)
    if splits > 1:
        block = min(1024, triton.next_power_of_2(p.n))
        _fold[(m, triton.cdiv(p.n, block))](ws, bias if bias is not None else ws, out, m, p.n, out.stride(0),
                                            SPLITS=splits, HAS_BIAS=bias is not None, BLOCK=block)
    return out


def rows(p: Planes, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """W[ids] [len(ids), K] in `dtype` (an embedding lookup over packed rows)."""
    ids = ids.reshape(-1).contiguous()
    out = torch.empty(ids.numel(), p.k, dtype=dtype, device=p.lo.device)
    if ids.numel():
        bk = min(1024, triton.next_power_of_2(p.k))
        _rows_kernel[(ids.numel(), triton.cdiv(p.k, bk))](ids, *_args(p), out, p.k, **_consts(p), BK=bk)
    return out


__all__ = ["Planes", "matmul", "rows", "tiles"]
