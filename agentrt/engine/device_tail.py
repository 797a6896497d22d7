"""A step's decisions with its logits left on the model's device (a GPU): constrained rows masked
there (constrain/masks.py copies the grammar's bitmask words over), every row's token chosen there
(sampling/device.py), greedy drafts' argmax taken there, and what the host needs (ids; the rows
of drafts that are verified on the host: sampled or constrained ones) fetched in one copy with one
wait, `StepFetch`. Only ids cross for a step without such drafts: 8 bytes a row, not its V
floats."""

from __future__ import annotations

import torch

from agentrt.records.request import Request


class StepFetch:
    """Device tensors the step's host part needs, queued by `add` and brought over by `run`: every
    one copied into pinned host memory without blocking, then one wait for the stream (on the
    CPU, nothing to copy or wait for). `syncs`: the waits so far (one per run on a GPU)."""

    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []
        self.host: list[torch.Tensor] = []
        self.syncs = 0

    def add(self, t: torch.Tensor) -> int:
        self.items.append(t)
        return len(self.items) - 1

    def run(self) -> None:
        if not any(t.device.type == "cuda" for t in self.items):
            self.host = list(self.items)
            return
        self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                     for t in self.items]
        torch.cuda.current_stream().synchronize()
        self.syncs += 1

    def __getitem__(self, handle: int) -> torch.Tensor:
        return self.host[handle]


def draw_seeds(reqs: list[Request]) -> list[int | None]:
    """Each sampled request's seed for the draw of its next output position (None: greedy)."""
    from agentrt.sampling import device as device_sampling  # (triton: imported where a step needs it)

    return [None if r.params.greedy else
            device_sampling.draw_seed(r.generator.initial_seed() if r.generator is not None else 0, len(r.output))
            for r in reqs]


def choose(rows: torch.Tensor, reqs: list[Request], argmax) -> torch.Tensor:
    """ids [R] on the rows' device for rows [R, V] of `reqs` (-1: a NaN row)."""
    from agentrt.sampling import device as device_sampling

    return device_sampling.sample(rows, [r.params for r in reqs], draw_seeds(reqs), argmax)


class NaNLogits(RuntimeError):
    """A request's logits row held NaN, so no token could be drawn."""

    def __init__(self) -> None:
        super().__init__("the model's logits row held NaN: no token can be drawn (its numerics broke: check the "
                         "weights, the dtype and the KV cache)")
