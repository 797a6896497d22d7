"""Segmented LoRA over one step's rows: the rows of each sequence that runs an adapter form a
segment, and each projection adds, per segment, its adapter's shrink-then-expand into the
projection's output (y[rows, part columns] += (x[rows] @ A.T) @ B.T). Rows of the base model, and
an aLoRA sequence's rows before its activation point, get nothing added, so their values are the
base model's exactly (what lets aLoRA share the base model's KV).

`LoraStep.of(chunks)` reads the segments off the step's chunks (SeqChunk.adapter and
`adapter_from`, in build_batch's row order); None when no row runs an adapter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrt.adapters.lora import LoraAdapter


@dataclass(frozen=True)
class LoraStep:
    """Row segments [start, end) of the step and the adapter each runs."""

    segments: tuple[tuple[int, int, LoraAdapter], ...]

    @staticmethod
    def of(chunks) -> "LoraStep | None":
        segs, row = [], 0
        for c in chunks:
            n = len(c.tokens)
            adapter = c.adapter
            if adapter is not None:
                first = row + max(0, min(n, c.adapter_from - c.start))  # (aLoRA: base rows before it)
                if first < row + n:
                    segs.append((first, row + n, adapter))
            row += n
        return LoraStep(tuple(segs)) if segs else None

    def add(self, layer: int, proj: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """y[rows, cols] += LoRA(x[rows]) for every segment whose adapter targets `proj` of `layer`."""
        for a, e, adapter in self.segments:
            parts = adapter.layers.get(layer, {}).get(proj)
            if not parts:
                continue
            xs = x[a:e]
            for p in parts:
                y[a:e, p.col:p.col + p.b.shape[0]] += (xs @ p.a.t()) @ p.b.t()
