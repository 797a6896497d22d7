"""One host -> device copy a step: a batch's int64 fields packed into a pinned host buffer.

A step's metadata (ids, positions, page table, slots, lengths, decode rows) is built on the host;
moving each tensor on its own costs one copy (and one launch) per tensor per step. The executor's
one `HostStaging` is the only host buffer a step's inputs pass through: `move` packs an eager
batch's tensors into it and returns views of one device copy; the CUDA-graph step
(model/graphs.py) writes its fields into `host(n)` in place and `send`s them into its static
device buffer."""

from __future__ import annotations

import torch


class HostStaging:
    """A reusable pinned buffer for one device. Before the buffer is handed out again, the
    previous copy out of it is waited for (its event), so a step never overwrites bytes still in
    flight."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self.buf: torch.Tensor | None = None  # [capacity] int64, on the host
        self.copied: torch.cuda.Event | None = None  # the last copy out of `buf` (pinned only)
        self.filled = torch.empty(0, dtype=torch.int64)  # the view host() handed out last

    def host(self, n: int) -> torch.Tensor:
        """The first n int64 of the host buffer [n], free to write (grown when short)."""
        if self.copied is not None:
            self.copied.synchronize()
            self.copied = None
        if self.buf is None or self.buf.numel() < n:
            size = max(n, 2 * (self.buf.numel() if self.buf is not None else 1024))
            self.buf = torch.empty(size, dtype=torch.int64, pin_memory=self.pinned)
        self.filled = self.buf[:n]
        return self.filled

    def send(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """What host(n) handed out last, on the device in one copy (asynchronous from pinned
        memory): into `out` (a device buffer [n]) when given, else a new tensor [n]."""
        src = self.filled
        if out is None:
            out = src.to(self.device, non_blocking=self.pinned)
        else:
            out.copy_(src, non_blocking=self.pinned)
        if self.pinned:
            self.copied = torch.cuda.Event()
            self.copied.record()
        return out

    def move(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """tensors: int64, on the host -> the same tensors on the device (views of one copy)."""
        sizes = [t.numel() for t in tensors]
        n = sum(sizes)
        flat = self.host(n)
        if sizes:
            torch.cat([t.reshape(-1) for t in tensors], out=flat)
        dev = self.send()
        return [p.view(t.shape) for p, t in zip(dev.split(sizes), tensors)]
