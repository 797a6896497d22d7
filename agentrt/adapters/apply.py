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


@dataclass(frozen=True)
class LoraStep:
    """Row segments [start, end) of the step and the adapter each runs."""

    segments: tuple[tuple[int, int, LoraAdapter], ...]
    _native: list = field(default_factory=list, repr=False, compare=False)  # [AgrtLoraStep | None], built once

    @staticmethod
    def of(chunks) -> "LoraStep | None":
        segs, row = [], 0
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
        if st is not None and x.stride(1) == 1 and y.stride(1) == 1:
            native.load().agrt_lora(ctypes.addressof(st), layer, PROJECTIONS.index(proj), x.data_ptr(), x.stride(0),
                                    y.data_ptr(), y.stride(0))
            return
        self.add_torch(layer, proj, x, y)

    def add_torch(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """`add` in torch's matmuls, segment by segment (the fallback, and the kernel's test)."""
        for a, e, adapter in self.segments:
            parts = adapter.layers.get(layer, {}).get(proj)
            if not parts:
                continue
            xs = x[a:e]
            for p in parts:
                y[a:e, p.col:p.col + p.b.shape[0]] += ((xs @ p.a.t().to(xs.dtype)) @ p.b.t().to(xs.dtype)).to(y.dtype)
