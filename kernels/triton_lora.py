"""Segmented LoRA in triton (the GPU path; CI runs it in triton's interpreter): one launch per
projection adds every segment's shrink-then-expand, y[rows, col:col + out] += (x[rows] @ A.T) @ B.T,
for all the step's adapters at once (S-LoRA / Punica's SGMV, without stacking the adapters: a
job table holds each (segment, part)'s rows and the addresses of its A and its B).

A job row of the table (int64): first row, rows, A's address ([rank, in]), B's address (stored
transposed, [rank, out]), rank, in, out, first output column. A program takes one job, one
block of BLOCK_N output columns and ROWS rows: it sums the shrink over `in` in BLOCK_K steps in
fp32 and adds its block of the expand into y (programs write disjoint blocks). Products are
elementwise multiply + sum (triton_ops.py: the interpreter's bf16 tl.dot is wrong; ranks are small).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FIELDS = 8  # row0, rows, a, b, rank, in, out, col
_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _sgmv_kernel(x_ptr, y_ptr, jobs_ptr, n_jobs, ldx, ldy, W: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    j, nb, rb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if j < n_jobs:
        job = jobs_ptr + j * 8
        row0, rows = tl.load(job), tl.load(job + 1)
        a_ptr = tl.load(job + 2).to(tl.pointer_type(W))
        b_ptr = tl.load(job + 3).to(tl.pointer_type(W))
        rank, n_in, n_out, col = tl.load(job + 4), tl.load(job + 5), tl.load(job + 6), tl.load(job + 7)
        offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_r = tl.arange(0, BLOCK_R)
        mask_n, mask_r = offs_n < n_out, offs_r < rank
        bt = tl.load(b_ptr + offs_r[:, None] * n_out + offs_n[None, :], mask=mask_r[:, None] & mask_n[None, :],
                     other=0.0).to(tl.float32)  # [R, N]: this block of B, read once for ROWS rows
        for i in range(ROWS):
            r = rb * ROWS + i
            if r < rows:
                row = (row0 + r).to(tl.int64)
                t = tl.zeros([BLOCK_R], dtype=tl.float32)
                for k0 in range(0, n_in, BLOCK_K):
                    offs_k = k0 + tl.arange(0, BLOCK_K)
                    mk = offs_k < n_in
                    xk = tl.load(x_ptr + row * ldx + offs_k, mask=mk, other=0.0).to(tl.float32)
                    a = tl.load(a_ptr + offs_r[:, None] * n_in + offs_k[None, :], mask=mask_r[:, None] & mk[None, :],
                                other=0.0).to(tl.float32)
                    t += tl.sum(a * xk[None, :], axis=1)
                delta = tl.sum(t[:, None] * bt, axis=0)
                yp = y_ptr + row * ldy + col + offs_n
                y = tl.load(yp, mask=mask_n, other=0.0).to(tl.float32)
                tl.store(yp, (y + delta).to(y_ptr.dtype.element_ty), mask=mask_n)


def job_rows(segments, layer: int, proj: str) -> list[list[int]]:
    """The job table's rows of projection `proj` of `layer` for a step's segments
    ((row0, row1, LoraAdapter) each)."""
    rows = []
    for r0, r1, adapter in segments:
        for p in adapter.layers.get(layer, {}).get(proj, ()):
            rows.append([r0, r1 - r0, p.a.data_ptr(), p.b.data_ptr(), p.a.shape[0], p.a.shape[1], p.b.shape[0], p.col])
    return rows


def weight_dtype(segments) -> torch.dtype | None:
    """The one dtype every adapter of the step is kept in (None: mixed or unsupported)."""
    kinds = {p.a.dtype for _, _, ad in segments for projs in ad.layers.values() for parts in projs.values()
             for p in parts}
    return next(iter(kinds)) if len(kinds) == 1 and next(iter(kinds)) in _DTYPES else None


def sgmv(x: torch.Tensor, y: torch.Tensor, jobs: torch.Tensor, max_rows: int, max_out: int, max_rank: int,
         dtype: torch.dtype) -> None:
    """y += every job's LoRA of x (jobs: [n, FIELDS] int64 on x's device; x, y with unit column stride)."""
    n = jobs.shape[0]
    if n == 0:
        return
    block_n, rows = 64, 16 if max_rows > 1 else 1
    grid = (n, triton.cdiv(max_out, block_n), triton.cdiv(max_rows, rows))
    _sgmv_kernel[grid](x, y, jobs, n, x.stride(0), y.stride(0), W=_DTYPES[dtype], BLOCK_K=64,
                       BLOCK_R=max(16, triton.next_power_of_2(max_rank)), BLOCK_N=block_n, ROWS=rows)
