"""Quantized linear layers and embeddings over packed integer weights (kernels/packing.py).

Modes of `load_model(..., quantize=...)`:
  "none"    fp32 (or bf16) dense weights: the accuracy reference.
  "native"  a GGUF's own quantization, repacked once at load (never dequantized to fp32):
            Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K; dense tensors of the file stay dense
            (a Hugging Face directory has none: it loads dense).
  "int8"    every linear layer quantized to int8 per group of 32 (the Q8_0 scheme) from its
            dense (or dequantized) weights.
  "auto"    (load_model's default) "native" for a GGUF when the compiled kernels are available
            and the model runs on the CPU in float32, else "none".
Every quantized layer runs one integer GEMM (AVX-512 VNNI) with activations quantized per row
and group to int8, as llama.cpp does: fast from decode (M=1) to prefill, and batch-invariant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.kernels.packing import PackedWeight, QuantMatrix, pack, qgemm, qrefine, qrows, quantize_int8
from agentrt.model.dense import Dense

QUANT_MODES = ("none", "native", "int8", "auto")
HEAD_REFINE = 8  # the output head's top logits per row recomputed from fp32 activations (QLinear)


def resolve_mode(mode: str, *, gguf: bool, cpu_fp32: bool, cuda: bool = False) -> str:
    """The load mode for `mode` given the source (a GGUF file?) and target (CPU float32? a
    CUDA device?): "auto" keeps a checkpoint's own form; "native" runs on the CPU in float32
    (kernels/packing.py) or on a GPU (model/device_quant.py); "int8" on the CPU only."""
    if mode not in QUANT_MODES:
        raise ConfigError(f"quantize={mode!r} is not supported; choose one of {QUANT_MODES}")
    if mode == "auto":  # (the kernel check last: it may build them)
        return "native" if gguf and (cuda or (cpu_fp32 and native.available())) else "none"
    if mode == "native" and cuda:
        return mode
    if mode == "int8" and cuda:
        raise ConfigError("quantize='int8' runs on the CPU kernels; on a GPU load a GGUF, whose own "
                          "quantization stays packed (quantize='native'), or use quantize='none'")
    if mode != "none" and not cpu_fp32:
        raise ConfigError(f"quantize={mode!r} runs on the CPU in float32; use quantize='none'")
    return mode


class QLinear(nn.Module):
    """y = x @ W^T (+ b) over one or more packed weights written side by side (fused q/k/v or
    gate/up whose GGUF formats differ stay separate parts of one layer). `precise`: activations
    as two int8 terms (kernels.packing.qgemm), twice the integer work. `refine` (the output
    head: HEAD_REFINE): each row's `refine` largest logits are recomputed from the fp32
    activations (kernels.packing.qrefine), so greedy decoding picks the fp32-activation argmax
    whenever it is among the int8 top k; at ~k/N of the GEMM's cost it replaced `precise` on
    the head, which doubled the head's work at batch 8 (the embedded demo's tool arguments
    needed one or the other with a float16 KV cache)."""

    def __init__(self, parts: list[PackedWeight], bias: torch.Tensor | None = None,
                 precise: bool = False, refine: int = 0):
        super().__init__()
        if refine and (len(parts) != 1 or bias is not None):
            raise ConfigError("QLinear(refine=k) needs one packed part and no bias (an output head)")
        self.parts, self.precise, self.refine = list(parts), precise, refine
        self.k = parts[0].k
        self.n_out = sum(p.n for p in parts)
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)

    @classmethod
    def from_matrices(cls, mats: list[QuantMatrix], bias: torch.Tensor | None = None,
                      precise: bool = False, refine: int = 0) -> "QLinear":
        groups: list[list[QuantMatrix]] = []
        for m in mats:  # fuse neighbours of the same format into one packed matrix
            if groups and groups[-1][0].compatible(m):
                groups[-1].append(m)
            else:
                groups.append([m])
        return cls([pack(QuantMatrix.cat(g) if len(g) > 1 else g[0]) for g in groups], bias, precise, refine)

    @property
    def weight_bytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None,
                accumulate: bool = False) -> torch.Tensor:
        """out (+)= x @ W^T; `accumulate=True` adds into `out` (a residual) in the kernel."""
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float()
        if out is None:
            out, accumulate = torch.empty(x2.shape[0], self.n_out, dtype=torch.float32), False
        if x2.shape[0]:
            a = 0
            for p in self.parts:
                b = None if self.bias is None else self.bias[a:a + p.n]
                qgemm(x2, p, out[:, a:a + p.n], accumulate, b, self.precise)
                a += p.n
            if self.refine and not accumulate:
                qrefine(x2, self.parts[0], out, self.refine)
        return out.reshape(*shape[:-1], self.n_out)


class QEmbedding(nn.Module):
    """Token embedding over a packed (possibly tied) table: rows are dequantized on lookup."""

    def __init__(self, packed: PackedWeight):
        super().__init__()
        self.packed = packed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return qrows(self.packed, ids).reshape(*ids.shape, self.packed.k)


def linear_from(parts: list[torch.Tensor | QuantMatrix], bias: torch.Tensor | None,
                precise: bool = False, refine: int = 0) -> QLinear:
    """A QLinear from HF-named parts ([out, in] tensors or QuantMatrix), dense parts as int8.
    `precise`, `refine`: see QLinear."""
    mats = [p if isinstance(p, QuantMatrix) else quantize_int8(p) for p in parts]
    return QLinear.from_matrices(mats, bias, precise, refine)


class Decoder(Protocol):
    """What quantization reads of a model (model/decoder.py::DecoderModel, which imports this
    module): its blocks and its output head."""

    lm_head: nn.Module

    def layers(self) -> Sequence[Any]: ...


M = TypeVar("M", bound=Decoder)


def linear_slots(model: Decoder) -> list[tuple[nn.Module, str]]:
    """(owner, attribute) of every linear layer of the decoder blocks (a mixture-of-experts
    MLP's experts included; its router stays float32)."""
    slots: list[tuple[nn.Module, str]] = []
    for block in model.layers():
        slots += [(block.attn, "qkv"), (block.attn, "o")]
        experts = block.mlp.experts  # (None: a dense MLP)
        mlps = [*experts, *([block.mlp.shared] if block.mlp.shared is not None else [])] \
            if experts is not None else [block.mlp]
        slots += [(mlp, name) for mlp in mlps for name in ("gate_up", "down")]
    return slots


def quantize(model: M, mode: str) -> M:
    """mode "int8": replace the decoder's dense linear layers (and the output head) by int8
    QLinear layers; "none": leave the model as it is."""
    if mode not in ("none", "int8"):
        raise ConfigError(f"quantize(model, {mode!r}): a loaded model can be quantized to 'int8' "
                          "('native' and 'auto' are load_model modes)")
    if mode == "none":
        return model
    for owner, name in linear_slots(model):
        layer = getattr(owner, name)
        if not isinstance(layer, QLinear):
            setattr(owner, name, linear_from([layer.weight], layer.bias))
    head = model.lm_head
    if isinstance(head, Dense):
        model.lm_head = linear_from([head.weight], None, refine=HEAD_REFINE)
    return model
