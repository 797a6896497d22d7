"""Segmented LoRA over one step's rows: the rows of each sequence that runs an adapter form a
segment, and each projection adds, per segment, its adapter's shrink-then-expand into the
projection's output (y[rows, part columns] += (x[rows] @ A.T) @ B.T). Rows of the base model, and
an aLoRA sequence's rows before its activation point, get nothing added, so their values are the
base model's exactly (what lets aLoRA share the base model's KV).

`LoraStep.of(chunks)` reads the segments off the step's chunks (SeqChunk.adapter and
`adapter_from`, in build_batch's row order); None when no row runs an adapter. On CPU in fp32 the
compiled kernel (kernels/csrc/lora.cpp, adapters/native.py) runs every segment of a projection in
one call, and `native()` hands its step description to the all-layers call; elsewhere each
segment runs torch's matmuls.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from agentrt.adapters import native as lora_native
from agentrt.adapters.lora import PROJECTIONS, LoraAdapter
from agentrt.kernels import native

Segment = tuple[int, int, LoraAdapter]  # rows [start, end) and the adapter they run


@dataclass(frozen=True)
class _JobTables:
    """The triton kernel's job table of every (layer, projection), on one device."""

    dtype: torch.dtype  # every adapter's weights' dtype
    jobs: dict[tuple[int, str], tuple[torch.Tensor, int, int, int]]  # -> (jobs, max_rows, max_out, max_rank)


@dataclass(frozen=True)
class LoraStep:
    """Row segments [start, end) of the step and the adapter each runs."""

    segments: tuple[Segment, ...]
    _native: list = field(default_factory=list, repr=False, compare=False)  # [AgrtLoraStep | None], built once
    # device -> the triton job tables (None: the kernel cannot run the step)
    _tables: dict[torch.device, _JobTables | None] = field(default_factory=dict, repr=False, compare=False)

    @staticmethod
    def of(chunks) -> "LoraStep | None":
        segs: list[Segment] = []
        row = 0
        for c in chunks:
            n = len(c.tokens)
            adapter = c.adapter
            if adapter is not None:
                first = row + max(0, min(n, c.adapter_from - c.start))  # (aLoRA: base rows before it)
                if first < row + n and segs and segs[-1][1] == first and segs[-1][2] is adapter:
                    segs[-1] = (segs[-1][0], row + n, adapter)  # (adjacent rows of one adapter: one segment)
                elif first < row + n:
                    segs.append((first, row + n, adapter))
            row += n
        return LoraStep(tuple(segs)) if segs else None

    def native(self):
        """The step's ctypes AgrtLoraStep for the compiled kernel, or None where it cannot run
        (no library, an adapter not on the CPU in fp32/bf16)."""
        if not self._native:
            self._native.append(lora_native.step_struct(self.segments) if native.available() else None)
        return self._native[0]

    def add(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y[rows, cols] += LoRA(x[rows]) for every segment whose adapter targets `proj` of `layer`."""
        st = self.native() if x.dtype == y.dtype == torch.float32 and x.device.type == "cpu" else None
        lib = native.load() if st is not None else None  # (loaded: native() checked it is available)
        if st is not None and lib is not None and x.stride(1) == 1 and y.stride(1) == 1:
            lib.agrt_lora(ctypes.addressof(st), layer, PROJECTIONS.index(proj), x.data_ptr(), x.stride(0),
                                    y.data_ptr(), y.stride(0))
            return
        if x.is_cuda and self.add_triton(layer, proj, x, y):
            return
        self.add_torch(layer, proj, x, y)

    def add_triton(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> bool:
        """`add` by the triton kernel (kernels/triton_lora.py; the GPU path, and on the CPU in
        triton's interpreter); False (nothing done) where it cannot run: no triton, adapters in
        mixed dtypes, or rows that are not unit-stride."""
        if x.device not in self._tables:
            self._tables[x.device] = self._build_tables(x.device)
        tables = self._tables[x.device]
        if tables is None or x.stride(1) != 1 or y.stride(1) != 1:
            return False
        entry = tables.jobs.get((layer, proj))
        if entry is None:  # (a layer past every adapter's last: nothing to add)
            return True
        jobs, max_rows, max_out, max_rank = entry
        from agentrt.kernels import triton_lora

        triton_lora.sgmv(x, y, jobs, max_rows, max_out, max_rank, tables.dtype)
        return True

    def _build_tables(self, device: torch.device) -> _JobTables | None:
        """Every (layer, projection)'s job table, copied to `device` in one transfer (None when the
        kernel cannot run the step)."""
        try:
            from agentrt.kernels import triton_lora
        except ImportError:
            return None
        dtype = triton_lora.weight_dtype(self.segments)
        if dtype is None:
            return None
        layers = 1 + max((max(ad.layers, default=-1) for _, _, ad in self.segments), default=-1)
        keys = [(i, p) for i in range(layers) for p in PROJECTIONS]
        rows = {k: triton_lora.job_rows(self.segments, *k) for k in keys}
        flat = torch.tensor([r for k in keys for r in rows[k]] or [[0] * triton_lora.FIELDS], dtype=torch.int64)
        flat = flat.to(device)
        jobs, at = {}, 0
        for k in keys:
            n = len(rows[k])
            jobs[k] = (flat[at:at + n], max((r[1] for r in rows[k]), default=0),
                       max((r[6] for r in rows[k]), default=0), max((r[4] for r in rows[k]), default=1))
            at += n
        return _JobTables(dtype, jobs)

    def add_torch(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """`add` in torch's matmuls, segment by segment (the fallback, and the kernel's test)."""
        for a, e, adapter in self.segments:
            parts = adapter.layers.get(layer, {}).get(proj)
            if not parts:
                continue
            xs = x[a:e]
            for p in parts:
                y[a:e, p.col:p.col + p.b.shape[0]] += ((xs @ p.a.t().to(xs.dtype)) @ p.b.t().to(xs.dtype)).to(y.dtype)
