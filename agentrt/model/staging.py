"""One host -> device copy a step: a batch's int64 tensors packed into a pinned host buffer.

A step's metadata (ids, positions, page table, slots, lengths, decode rows) is built on the host
as small tensors; moving each on its own costs one copy (and one launch) per tensor per step.
`HostStaging.move` packs them into one pinned buffer, copies it once (asynchronously on a GPU)
and returns views of the device copy in the same order and shapes."""

from __future__ import annotations

import torch


class HostStaging:
    """A reusable pinned buffer for one device. Before the buffer is refilled, the previous
    copy out of it is waited for (its event), so a step never overwrites bytes still in flight."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.buf: torch.Tensor | None = None
        self.copied: "torch.cuda.Event | None" = None

    def _buffer(self, n: int) -> torch.Tensor:
        if self.copied is not None:
            self.copied.synchronize()
        if self.buf is None or self.buf.numel() < n:
            size = max(n, 2 * (self.buf.numel() if self.buf is not None else 1024))
            self.buf = torch.empty(size, dtype=torch.int64, pin_memory=self.pinned)
        return self.buf[:n]

    def move(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """tensors: int64, on the host -> the same tensors on the device (views of one copy)."""
        sizes = [t.numel() for t in tensors]
        flat = self._buffer(sum(sizes))
        if sizes:
            torch.cat([t.reshape(-1) for t in tensors], out=flat)
        dev = flat.to(self.device, non_blocking=self.pinned)
        if self.pinned:
            self.copied = torch.cuda.Event()
            self.copied.record()
        return [p.view(t.shape) for p, t in zip(dev.split(sizes), tensors)]
