"""The float (unquantized) linear layer of the decoder and its experts."""

from __future__ import annotations

import torch
from torch import nn

from agentrt.errors import ModelLoadError


class Dense(nn.Module):
    """y = x @ W (+ b) with W stored [in, out]: on CPU, torch's GEMV/GEMM streams this layout
    1.3-1.5x faster than nn.Linear's [out, in] (bench/bench_model.py measures the step)."""

    def __init__(self, n_in: int, n_out: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight_t = nn.Parameter(torch.empty(n_in, n_out, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(n_out, dtype=dtype), requires_grad=False) if bias else None

    @property
    def weight(self) -> torch.Tensor:
        """[out, in] view, as nn.Linear has it."""
        return self.weight_t.t()

    def load(self, w: torch.Tensor, b: torch.Tensor | None = None) -> None:
        self.weight_t.copy_(w.t())
        if b is not None:
            if self.bias is None:
                raise ModelLoadError(f"a bias of {tuple(b.shape)} for a layer built without one")
            self.bias.copy_(b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is None:
            return torch.matmul(x, self.weight_t)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight_t).reshape(*x.shape[:-1], -1)
