"""agentrt.kernels.backends: the hot tensor operations behind one small interface.

Every operation has a pure-torch reference in `reference.py` (the eager path and the oracle
in tests); triton versions (`triton_ops.py`) replace them on CUDA. Which one runs is decided
once, when a model is built, by `get_backend(name, device)`; nothing is chosen at import time.
On CPU the fused forward (agentrt/model/fused.py) calls the compiled kernels of `csrc/`
(built and loaded by `native.py`; quantized weights and their GEMM in `packing.py`).
"""

from __future__ import annotations

import torch

from agentrt.errors import ConfigError
from agentrt.kernels.base import KernelBackend
from agentrt.kernels.reference import TorchBackend

BACKENDS = ("auto", "torch", "triton")


def triton_available(device: torch.device) -> bool:
    """True when triton kernels can run on `device` (a CUDA device with triton installed)."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def get_backend(name: str = "auto", device: torch.device | str = "cpu") -> KernelBackend:
    """Pick the kernel backend: "auto" = triton on CUDA when available, torch elsewhere."""
    if name not in BACKENDS:
        raise ConfigError(f"kernel backend {name!r} is unknown; choose one of {BACKENDS}")
    device = torch.device(device)
    if name == "torch" or (name == "auto" and not triton_available(device)):
        return TorchBackend()
    if not triton_available(device):
        raise ConfigError("kernel backend 'triton' needs a CUDA device and `pip install agentrt[gpu]`")
    from agentrt.kernels.triton_ops import TritonBackend

    return TritonBackend()


__all__ = ["KernelBackend", "TorchBackend", "get_backend", "triton_available", "BACKENDS"]
