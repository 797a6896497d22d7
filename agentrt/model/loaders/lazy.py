"""Quantized GGUF matrices read when the model packs them, not when the file is opened.

`LazyQuant` is a matrix's rows in the file: a view of the memory map and a row index (all rows,
an expert's rows of an [experts, out, in] tensor, Q/K rows in RoPE order, a split of a fused
projection). The loader's layout steps (layouts.rows, gguf.unpermute_rope_rows) compose the
index without reading anything; `materialize` unpacks just those rows into a QuantMatrix, which
the model packs at once and drops. So loading a native GGUF holds one layer's unpacked
matrices at a time beside the packed model (unpacked, a 4-bit weight takes a byte: all of them
at once would be twice the file).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from agentrt.errors import CorruptModelFile
from agentrt.kernels.packing import QuantMatrix
from agentrt.model.loaders import gguf_quant


class LazyQuant:
    """Rows `index` (None: all) of the quantized GGUF tensor `tensor` (rows of a 3-D tensor run
    over its first two dimensions)."""

    def __init__(self, tensor: Any, index: np.ndarray | None = None, source: str = "",
                 release: Callable[[int, int], None] | None = None):
        # release(offset, n_bytes): drop the file's pages once read (GGUFFile.release)
        self.tensor, self.index, self.source, self.release = tensor, index, source, release
        *outer, self.cols = (int(d) for d in reversed(tensor.shape.tolist()))
        self.total = int(np.prod(outer))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.total if self.index is None else len(self.index), self.cols)

    def select(self, index: Any) -> "LazyQuant":
        """Rows `index` (a slice or an index tensor/array) of these rows, still unread."""
        base = np.arange(self.total) if self.index is None else self.index
        index = index.numpy() if isinstance(index, torch.Tensor) else index
        return LazyQuant(self.tensor, np.ascontiguousarray(base[index]), self.source, self.release)

    def _rows(self) -> np.ndarray:
        raw = self.tensor.data.reshape(self.total, -1)
        return raw if self.index is None else raw[self.index]  # (reads only these rows of the map)

    def _release(self) -> None:
        """Drop the file's pages of the rows just read (copied out by then)."""
        if self.release is not None and self.shape[0]:
            t = self.tensor
            row_bytes = t.n_bytes // self.total
            first, last = (0, self.total - 1) if self.index is None else (int(self.index.min()), int(self.index.max()))
            self.release(t.data_offset + first * row_bytes, (last + 1 - first) * row_bytes)

    def blocks(self) -> np.ndarray:
        """The rows' GGUF block bytes [rows, bytes per row], copied out of the file: what a GPU's
        planes are built from (model/device_quant.py)."""
        raw = np.array(self._rows())
        self._release()
        return raw

    def load(self) -> QuantMatrix:
        t = self.tensor
        qm = gguf_quant.unpack_gguf(self._rows(), t.tensor_type, self.shape[0], self.cols)
        self._release()
        # the integers cannot be wrong in a way we can see; the blocks' fp16 scales (d, dmin) can
        try:
            check_finite(t, qm.s.numpy(), "block scales")
            if qm.m is not None:
                check_finite(t, qm.m.numpy(), "block minimums")
        except CorruptModelFile as exc:
            raise CorruptModelFile(f"{self.source}: {exc}" if self.source else str(exc)) from None
        return qm


# a weight as read: a float tensor, a quantized matrix, or a GGUF tensor kept quantized until
# the layer it fills takes it (native quantization)
Weight = torch.Tensor | QuantMatrix | LazyQuant

def materialize(w: Any) -> Any:
    """A LazyQuant unpacked (QuantMatrix); anything else as it is."""
    return w.load() if isinstance(w, LazyQuant) else w


def check_finite(tensor: Any, values: np.ndarray, what: str = "values") -> None:
    """CorruptModelFile naming the tensor unless every value is finite: damaged bytes of the right
    size (a bad download or disk) decode as NaN/Inf in a weight or a block scale. One sum in the
    array's dtype (NaN/Inf propagate through it) is the fast path; only a non-finite sum, which an
    overflow of finite values could also give, is checked element by element."""
    with np.errstate(invalid="ignore", over="ignore"):
        if values.size == 0 or np.isfinite(values.sum()):
            return
    bad = ~np.isfinite(values)
    n_bad = int(bad.sum())
    if n_bad:
        first = np.unravel_index(int(np.argmax(bad)), values.shape)
        raise CorruptModelFile(
            f"tensor {tensor.name} ({tensor.tensor_type.name}) has {n_bad} NaN/Inf {what} (first at index "
            f"{tuple(int(i) for i in first)}): the file is damaged; re-download it")
