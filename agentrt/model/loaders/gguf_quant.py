"""GGUF quantized blocks -> QuantMatrix (integers + per-group scale/min), without going through fp32.

Each unpacker reads the block bytes the way gguf's own numpy dequantizer does and returns the
integers q and per-group parameters such that `QuantMatrix.dequantize()` equals
`gguf.quants.dequantize(...)` bit for bit (tests/test_qformats.py checks every format):

    Q8_0  d*(q-128)        Q4_0 d*(q-8)     Q5_0 d*(q-16)      Q4_1/Q5_1  d*q + m
    Q4_K/Q5_K  (d*sc)*q - dmin*mn  (groups of 32)              Q6_K  (d*sc)*(q-32)  (groups of 16)
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import Q4_K

from agentrt.kernels.packing import QuantMatrix

QK_K = 256


def _f16(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16).astype(np.float32)  # [nb, 1]


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """[nb, ..., width] bytes -> [nb, ..., 2*width]: low nibbles first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray, n: int) -> np.ndarray:
    """[nb, 4] bytes = 32 bits -> [nb, 32] bit j of the little-endian uint32."""
    bits = qh.copy().view(np.uint32).reshape(-1, 1) >> np.arange(n, dtype=np.uint32)
    return (bits & 1).astype(np.uint8)


def _q8_0(b):
    return b[:, 2:].copy().view(np.int8).astype(np.int16) + 128, _f16(b[:, :2]), None, 128, 32


def _q4_0(b):
    return _nibbles(b[:, 2:], 16), _f16(b[:, :2]), None, 8, 32


def _q4_1(b):
    return _nibbles(b[:, 4:], 16), _f16(b[:, :2]), _f16(b[:, 2:4]), 0, 32


def _q5_0(b):
    return _nibbles(b[:, 6:], 16) | (_high_bits(b[:, 2:6], 32) << 4), _f16(b[:, :2]), None, 16, 32


def _q5_1(b):
    q = _nibbles(b[:, 8:], 16) | (_high_bits(b[:, 4:8], 32) << 4)
    return q, _f16(b[:, :2]), _f16(b[:, 2:4]), 0, 32


def _k_scales(b):
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = Q4_K.get_scale_min(b[:, 4:16].copy())
    return d * sc.astype(np.float32), -(dmin * mn.astype(np.float32))  # [nb, 8] each


def _q4_k(b):
    s, m = _k_scales(b)
    q = _nibbles(b[:, 16:].reshape(-1, 4, 32), 32).reshape(-1, QK_K)
    return q, s, m, 0, 32


def _q5_k(b):
    s, m = _k_scales(b)
    ql = _nibbles(b[:, 48:].reshape(-1, 4, 32), 32)  # [nb, 4, 64] = sub-blocks 0..7 of 32
    qh = b[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    q = ql.reshape(-1, 8, 32) | ((qh & 1) << 4)
    return q.reshape(-1, QK_K), s, m, 0, 32


def _q6_k(b):
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 8, 32)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(-1, 8, 32)
    q = (ql | (qh << 4)).reshape(-1, QK_K)
    s = _f16(b[:, 208:210]) * b[:, 192:208].copy().view(np.int8).astype(np.float32)  # [nb, 16]
    return q, s, None, 32, 16


UNPACKERS = {T.Q8_0: _q8_0, T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1,
             T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k}
BLOCK = {T.Q8_0: (32, 34), T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q5_0: (32, 22), T.Q5_1: (32, 24),
         T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210)}


def supported(qtype) -> bool:
    return qtype in UNPACKERS


def unpack_gguf(data: np.ndarray, qtype, rows: int, cols: int) -> QuantMatrix:
    """Raw block bytes of a [rows, cols] matrix (row-major, blocks along cols) -> QuantMatrix."""
    size, nbytes = BLOCK[qtype]
    blocks = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, nbytes)
    q, s, m, z, group = UNPACKERS[qtype](blocks)
    ng = cols // group
    as_t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).reshape(rows, ng))  # noqa: E731
    qt = torch.from_numpy(np.ascontiguousarray(q, dtype=np.uint8).reshape(rows, cols))
    return QuantMatrix(qt, as_t(s), None if m is None else as_t(m), z, group, qtype.name)
