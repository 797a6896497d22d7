"""A GGUF's quantization kept on a GPU: packed planes, linear layers and embeddings over them.

`load_model(path.gguf, device="cuda")` (quantize "auto" or "native") builds these instead of the
CPU's tiled `QLinear` (model/quant.py): each quantized matrix becomes a `DeviceWeight`, the file's
blocks split into planes the triton kernel reads (kernels/triton_quant.py documents them), about
the file's own bytes (Q4_K 4.6 bits a weight against the file's 4.5). Nothing is dequantized at
load: the kernel dequantizes in registers, a tile at a time.

On the CPU (tests, a CUDA-less machine that loaded for a GPU) a layer computes the same product
in torch from `DeviceWeight.dequantize()`, an implementation independent of the kernel's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K
from torch import nn

from agentrt.errors import ConfigError
from agentrt.kernels.base import KernelBackend
from agentrt.kernels.packing import QuantMatrix
from agentrt.model.config import ModelConfig
from agentrt.model.dense import Dense
from agentrt.model.loaders import gguf_quant
from agentrt.model.loaders.lazy import LazyQuant, check_finite

# format -> (bits of q, group, z, scales two-level?, min kind: 0 none, 1 flat, 2 two-level)
FORMATS = {T.Q8_0: (8, 32, 128, False, 0), T.Q4_0: (4, 32, 8, False, 0), T.Q4_1: (4, 32, 0, False, 1),
           T.Q5_0: (5, 32, 16, False, 0), T.Q5_1: (5, 32, 0, False, 1), T.Q4_K: (4, 32, 0, True, 2),
           T.Q5_K: (5, 32, 0, True, 2), T.Q6_K: (6, 16, 32, True, 0)}
PLANES = ("lo", "hi", "sd", "sc", "md", "mc")


def _f16(b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(b.copy().view(np.float16))


def _scales(blocks: np.ndarray, qtype, rows: int) -> dict[str, torch.Tensor]:
    """The blocks' scale planes, as stored (never multiplied out): sd/md per 256, sc/mc per group."""
    r = lambda t: t.reshape(rows, -1).contiguous()  # noqa: E731
    if qtype == T.Q6_K:
        return {"sd": r(_f16(blocks[:, 208:210])), "sc": r(torch.from_numpy(blocks[:, 192:208].copy().view(np.int8)))}
    if qtype in (T.Q4_K, T.Q5_K):
        sc, mn = Q4_K.get_scale_min(blocks[:, 4:16].copy())
        return {"sd": r(_f16(blocks[:, 0:2])), "sc": r(torch.from_numpy(sc.astype(np.uint8))),
                "md": r(_f16(blocks[:, 2:4])), "mc": r(torch.from_numpy(mn.astype(np.uint8)))}
    out = {"sc": r(_f16(blocks[:, 0:2]))}
    if qtype in (T.Q4_1, T.Q5_1):
        out["mc"] = r(_f16(blocks[:, 2:4]))
    return out


def _bit_planes(q: torch.Tensor, bits: int) -> dict[str, torch.Tensor]:
    """q [N, K] uint8 -> lo (nibble pairs, or q itself for 8 bits) and hi (the bits above 4)."""
    if bits == 8:
        return {"lo": q.contiguous()}
    n, k = q.shape
    low = q & 15
    out = {"lo": (low[:, 0::2] | (low[:, 1::2] << 4)).contiguous()}
    if bits > 4:
        per = 8 // (bits - 4)  # values per byte of the high plane
        h = (q >> 4).to(torch.int32).reshape(n, k // per, per) << (torch.arange(per, dtype=torch.int32) * (bits - 4))
        out["hi"] = h.sum(-1).to(torch.uint8)
    return out


class DeviceWeight(nn.Module):
    """One packed matrix W [N, K] (its planes are buffers: `.to(device)` moves them)."""

    lo: torch.Tensor  # the values' low nibbles (uint8, two a byte), the 8-bit values, or a dense matrix
    hi: torch.Tensor | None  # the bits above 4 (5- and 6-bit formats)
    sd: torch.Tensor | None  # K-quants: the scale of each 256 values
    sc: torch.Tensor | None  # the scale of each group (None: a dense matrix)
    md: torch.Tensor | None  # K-quants: the min of each 256 values
    mc: torch.Tensor | None  # the min of each group (formats with mins)

    def __init__(self, planes: dict[str, torch.Tensor], fmt: str, qbits: int, group: int, z: int, n: int, k: int):
        super().__init__()
        for name in PLANES:
            self.register_buffer(name, planes.get(name))
        self.fmt, self.qbits, self.group, self.z, self.n, self.k = fmt, qbits, group, z, n, k

    @classmethod
    def from_blocks(cls, blocks: np.ndarray, qtype, rows: int, cols: int) -> "DeviceWeight":
        """The planes of a [rows, cols] matrix from its GGUF block bytes (row-major)."""
        if qtype not in FORMATS:
            raise ConfigError(f"GGUF format {qtype.name} has no GPU kernel; supported: "
                              f"{', '.join(q.name for q in FORMATS)} (or load with quantize='none')")
        bits, group, z, _, _ = FORMATS[qtype]
        blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, gguf_quant.BLOCK[qtype][1])
        q = torch.from_numpy(np.ascontiguousarray(gguf_quant.UNPACKERS[qtype](blocks)[0], dtype=np.uint8))
        planes = {**_bit_planes(q.reshape(rows, cols), bits), **_scales(blocks, qtype, rows)}
        return cls(planes, qtype.name, bits, group, z, rows, cols)

    @classmethod
    def dense(cls, w: torch.Tensor) -> "DeviceWeight":
        """A float [N, K] matrix in the same kernel (QBITS 16: batch-invariant dense GEMM)."""
        return cls({"lo": w.contiguous()}, str(w.dtype).removeprefix("torch."), 16, 1, 0, *w.shape)

    @staticmethod
    def cat(parts: list["DeviceWeight"]) -> "DeviceWeight":
        """Stack along N (fused q/k/v or gate/up of one format)."""
        first = parts[0]
        planes = {n: torch.cat([getattr(p, n) for p in parts]) for n in PLANES if getattr(first, n) is not None}
        return DeviceWeight(planes, first.fmt, first.qbits, first.group, first.z, sum(p.n for p in parts), first.k)

    def compatible(self, other: "DeviceWeight") -> bool:
        return (self.fmt, self.k, self.lo.dtype) == (other.fmt, other.k, other.lo.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())

    def planes(self):
        from agentrt.kernels.triton_quant import Planes

        return Planes(self.lo, self.hi, self.sd, self.sc, self.md, self.mc, self.qbits, self.group, self.z,
                      self.n, self.k)

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32 in torch (the reference the kernel is tested against)."""
        if self.qbits == 16 or self.sc is None:  # (a dense matrix: no scales)
            return self.lo.float()
        n, k, g = self.n, self.k, self.group
        if self.qbits == 8:
            q = self.lo.to(torch.int32)
        else:
            q = torch.stack((self.lo & 15, self.lo >> 4), -1).reshape(n, k).to(torch.int32)
            if self.hi is not None:
                b = self.qbits - 4
                per = 8 // b
                sh = torch.arange(per, device=q.device, dtype=torch.int32) * b
                q = q | (((self.hi.to(torch.int32)[..., None] >> sh) & ((1 << b) - 1)).reshape(n, k) << 4)
        s = self.sc.float()
        if self.sd is not None:
            s = self.sd.float().repeat_interleave(256 // g, 1) * s
        w = s.repeat_interleave(g, 1) * (q - self.z).float()
        if self.mc is not None:
            m = self.mc.float() if self.md is None else \
                -(self.md.float().repeat_interleave(256 // g, 1) * self.mc.float())
            w = w + m.repeat_interleave(g, 1)
        return w


def _use_triton(layer: DeviceQLinear | DeviceQEmbedding, x: torch.Tensor) -> bool:
    return layer.impl == "triton" or (layer.impl == "auto" and x.is_cuda)


class DeviceQLinear(nn.Module):
    """y = x @ W^T (+ b) over packed parts written side by side (q/k/v or gate/up whose formats
    differ stay separate parts). `invariant`: the kernel's tiles never depend on the rows
    (model.batch_invariant). `impl`: "auto" (the kernel on CUDA, torch elsewhere), "triton"
    (also in triton's interpreter: tests), "torch"."""

    bias: torch.Tensor | None  # [N] (a buffer)

    def __init__(self, parts: list[DeviceWeight], bias: torch.Tensor | None = None):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.register_buffer("bias", None if bias is None else bias.detach().contiguous())
        self.k, self.n_out = parts[0].k, sum(p.n for p in parts)
        self.invariant, self.impl = True, "auto"

    @classmethod
    def fused(cls, weights: list[DeviceWeight], bias: torch.Tensor | None = None) -> "DeviceQLinear":
        groups: list[list[DeviceWeight]] = []
        for w in weights:  # (neighbours of one format become one matrix: one launch)
            if groups and groups[-1][0].compatible(w):
                groups[-1].append(w)
            else:
                groups.append([w])
        return cls([DeviceWeight.cat(g) if len(g) > 1 else g[0] for g in groups], bias)

    def weights(self) -> list[DeviceWeight]:
        """The parts, typed (nn.ModuleList holds plain Modules)."""
        return [p for p in self.parts if isinstance(p, DeviceWeight)]

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.weights())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, self.k)
        out = torch.empty(x2.shape[0], self.n_out, dtype=x.dtype, device=x.device)
        a = 0
        for p in self.weights():
            b = None if self.bias is None else self.bias[a:a + p.n]
            if _use_triton(self, x):
                from agentrt.kernels import triton_quant

                triton_quant.matmul(x2, p.planes(), out[:, a:a + p.n], b, self.invariant)
            else:
                y = x2.float() @ p.dequantize().t()
                out[:, a:a + p.n] = y if b is None else y + b.float()
            a += p.n
        return out.reshape(*shape[:-1], self.n_out)


class DeviceQEmbedding(nn.Module):
    """Token embedding over a packed table (rows dequantized on lookup); a tied head shares it."""

    def __init__(self, weight: DeviceWeight, dtype: torch.dtype):
        super().__init__()
        self.weight, self.dtype, self.impl = weight, dtype, "auto"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if _use_triton(self, ids):
            from agentrt.kernels import triton_quant

            out = triton_quant.rows(self.weight.planes(), ids, self.dtype)
        else:
            out = self.weight.dequantize()[ids.reshape(-1)].to(self.dtype)
        return out.reshape(*ids.shape, self.weight.k)


def from_lazy(lq: LazyQuant) -> DeviceWeight:
    """A file's quantized rows as planes; damaged block scales (NaN/Inf) are CorruptModelFile."""
    w = DeviceWeight.from_blocks(lq.blocks(), lq.tensor.tensor_type, *lq.shape)
    for name in ("sd", "sc", "md", "mc"):
        t = getattr(w, name)
        if t is not None and t.dtype == torch.float16:
            check_finite(lq.tensor, t.numpy(), "block scales")
    return w


def device_weight(part, dtype: torch.dtype) -> DeviceWeight:
    """A layer's part for a GPU: a file's quantized rows as planes, a float one dense in `dtype`."""
    if isinstance(part, LazyQuant):
        return from_lazy(part)
    return DeviceWeight.dense((part.dequantize() if isinstance(part, QuantMatrix) else part).to(dtype))


class Placed(Protocol):
    """What `place` reads of a model (model/decoder.py::DecoderModel, which imports this module)."""

    ops: KernelBackend
    cfg: ModelConfig

    def modules(self) -> Iterator[nn.Module]: ...


def place(model: Placed, invariant: bool) -> None:
    """After the model moved to its device. On the triton backend (CUDA; triton's interpreter
    in tests) every packed layer runs the kernel; with `invariant`, dense (bf16) linear layers
    become dense DeviceQLinear layers too, so every GEMM of the step reduces each row the same
    way whatever the batch (cuBLAS picks its kernel, and so its reduction order, by M), and the
    attention takes a fixed split with every row token by token (DecoderModel.short_limit)."""
    on_triton = model.ops.name == "triton"
    owners = [(o, n) for o in model.modules() for n, c in list(o.named_children()) if isinstance(c, Dense)]
    for owner, name in owners if on_triton and invariant else []:
        layer = getattr(owner, name)
        setattr(owner, name, DeviceQLinear([DeviceWeight.dense(layer.weight.contiguous())], layer.bias))
    for m in model.modules():
        if isinstance(m, (DeviceQLinear, DeviceQEmbedding)):
            m.impl = "triton" if on_triton else "torch"  # (kernels="torch" on a GPU: no triton needed)
        if isinstance(m, DeviceQLinear):
            m.invariant = invariant
    if on_triton:
        from agentrt.kernels.triton_attention import invariant_chunk

        model.ops.invariant_chunk = invariant_chunk(model.cfg.max_position_embeddings) if invariant else 0


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights: parameters (dense layers, norms) and packed planes, each
    tensor counted once (a tied head shares its embedding's); RoPE tables are not weights."""
    tensors: list[torch.Tensor] = [*model.parameters()]
    for m in model.modules():
        if isinstance(m, (DeviceWeight, DeviceQLinear)):
            tensors += list(m.buffers(recurse=False))
    seen: dict[int, int] = {}  # data_ptr -> bytes
    for t in tensors:
        seen.setdefault(t.data_ptr(), t.numel() * t.element_size())
    return sum(seen.values())


__all__ = ["DeviceWeight", "DeviceQLinear", "DeviceQEmbedding", "FORMATS", "device_weight", "from_lazy", "place",
           "weight_bytes"]
