"""Quantized weights in the layout the CPU kernel reads, and the operations on them.

A weight matrix W [N, K] (N outputs) is kept as unsigned integers with per-group parameters:

    w[n, k] = s[n, g] * (q[n, k] - z)  (+ m[n, g])      g = k // G

which is how every GGUF block format dequantizes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
Q6_K), so the repacked matrix gives back exactly what gguf's dequantizer gives. `bits` is the
storage: 4 (two values per byte) when q < 16, else 8.

`PackedWeight` stores q in tiles of 16 output columns, the order one AVX-512 VNNI instruction
consumes (16 columns x 4 consecutive k); 4-bit tiles hold two such k-steps per byte (low nibble:
the even step). s and m are [tiles, K/G, 16] fp32. `qgemm` runs the compiled kernel
(kernels/csrc/qgemm.cpp) or, without it, a torch emulation of the same integer arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrt.errors import ConfigError
from agentrt.kernels import native


@dataclass(frozen=True)
class QuantMatrix:
    """Unpacked: q [N, K] uint8, s [N, K/G] fp32, m [N, K/G] fp32 or None."""

    q: torch.Tensor
    s: torch.Tensor
    m: torch.Tensor | None
    z: int
    group: int
    fmt: str = "int8"

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1]

    @property
    def bits(self) -> int:
        return 4 if int(self.q.max()) < 16 and self.group % 8 == 0 else 8

    def dequantize(self) -> torch.Tensor:
        """W [N, K] fp32, with the same float operations as gguf's dequantizers."""
        s = self.s.repeat_interleave(self.group, dim=1)
        w = s * (self.q.to(torch.int32) - self.z).float()
        if self.m is not None:
            w = w + self.m.repeat_interleave(self.group, dim=1)
        return w

    def compatible(self, other: "QuantMatrix") -> bool:
        return (self.z, self.group, self.m is None, self.q.shape[1]) == \
            (other.z, other.group, other.m is None, other.q.shape[1])

    @staticmethod
    def cat(parts: list["QuantMatrix"]) -> "QuantMatrix":
        """Stack along N (fusing q/k/v or gate/up); the parts must be compatible."""
        first = parts[0]
        return QuantMatrix(torch.cat([p.q for p in parts]), torch.cat([p.s for p in parts]),
                           None if first.m is None else torch.cat([p.m for p in parts if p.m is not None]),
                           first.z, first.group, first.fmt)


@dataclass(frozen=True)
class PackedWeight:
    q: torch.Tensor  # uint8, [tiles, K*16*bits/8]
    # s: [tiles, K/G, 16]: fp16 when every scale and min is exactly an fp16, else fp32; or the
    # K-quants' two levels (uint8 [tiles, K/256, 160]: `two_level`)
    s: torch.Tensor
    m: torch.Tensor | None
    z: int
    bits: int
    group: int
    n: int  # valid output rows (N); tiles * 16 >= N
    k: int
    fmt: str = "int8"

    @property
    def half(self) -> int:
        """How the kernels read s and m: 0 fp32, 1 fp16, 2 two-level (kernels/csrc/qmat.h)."""
        return 2 if self.s.dtype == torch.uint8 else int(self.s.dtype == torch.float16)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.s, self.m) if t is not None)


def pack(qm: QuantMatrix) -> PackedWeight:
    n, k = qm.q.shape
    g, bits = qm.group, qm.bits
    if k % g or g % 4 or (bits == 4 and g % 8):
        raise ConfigError(f"cannot pack a [{n}, {k}] matrix with groups of {g}")
    tiles = -(-n // 16)
    pad = tiles * 16 - n
    q = torch.nn.functional.pad(qm.q, (0, 0, 0, pad)) if pad else qm.q
    s = torch.nn.functional.pad(qm.s, (0, 0, 0, pad)) if pad else qm.s
    m = qm.m if qm.m is None or not pad else torch.nn.functional.pad(qm.m, (0, 0, 0, pad))
    if bits == 8:
        t = q.reshape(tiles, 16, k // 4, 4).permute(0, 2, 1, 3)
    else:
        t = q.reshape(tiles, 16, k // 8, 2, 4)
        t = (t[:, :, :, 0] | (t[:, :, :, 1] << 4)).permute(0, 2, 1, 3)
    q = t.contiguous().reshape(tiles, -1)
    # GGUF's Q4_0/Q4_1/Q5_x/Q8_0 store their scales and mins as fp16: keep 2 bytes, not 4
    half = all(a is None or torch.equal(a.half().float(), a) for a in (s, m))
    two = None if half or g != 32 or k % 256 else [two_level(a) for a in (s, m) if a is not None]
    if two and all(x is not None for x in two):  # (Q4_K / Q5_K: d x 6-bit scale, as the file has them)
        d_c = [x for x in two if x is not None]  # [(d, c)] of s, then of m
        lay2 = [_lay_two_level(d, c, tiles) for d, c in d_c]
        return PackedWeight(q, lay2[0], None if m is None else lay2[1], qm.z, bits, g, n, k, qm.fmt)
    dt = torch.float16 if half else torch.float32
    lay = lambda a: a.reshape(tiles, 16, k // g).permute(0, 2, 1).contiguous().to(dt)  # noqa: E731
    return PackedWeight(q, lay(s), None if m is None else lay(m), qm.z, bits, g, n, k, qm.fmt)


def two_level(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """a [N, K/32] fp32 as d [N, K/256] (each an fp16) x c [N, K/32] (integers 0..255), exactly
    (d * c == a in fp32), or None. K-quants store their scales so (d, 6-bit sub-scales); the
    file's d is found by trying the largest sub-scale of each block as 63, 62, ... (gguf's
    quantizers make it 63 in most blocks), on the blocks not yet solved."""
    n, ng = a.shape
    blocks = a.reshape(-1, 8)
    ref = blocks.gather(1, blocks.abs().argmax(1, keepdim=True))  # [B, 1]: the largest magnitude
    d, c = torch.zeros_like(ref), torch.zeros(blocks.shape, dtype=torch.uint8)
    todo = (ref[:, 0] != 0).nonzero()[:, 0]
    for top in range(63, 0, -1):
        if not todo.numel():
            break
        b, dk = blocks[todo], ref[todo] / top
        ck = torch.round(b / dk)
        ok = (dk[:, 0].half().float() == dk[:, 0]) & (dk * ck == b).all(1) & (ck >= 0).all(1) & (ck <= 255).all(1)
        d[todo[ok]], c[todo[ok]] = dk[ok], ck[ok].to(torch.uint8)
        todo = todo[~ok]
    if todo.numel():
        return None
    return d.reshape(n, ng // 8), c.reshape(n, ng)


def _lay_two_level(d: torch.Tensor, c: torch.Tensor, tiles: int) -> torch.Tensor:
    """Per tile and block of 256: the 16 columns' d (fp16, 32 bytes), then their sub-scales
    (8 groups x 16 columns, 128 bytes): uint8 [tiles, K/256, 160]."""
    nb = d.shape[1]
    dd = d.reshape(tiles, 16, nb).permute(0, 2, 1).contiguous().half().view(torch.uint8)
    cc = c.reshape(tiles, 16, nb, 8).permute(0, 2, 3, 1).reshape(tiles, nb, 128)
    return torch.cat([dd, cc], -1).contiguous()


def _unlay_two_level(x: torch.Tensor) -> torch.Tensor:
    """The inverse of _lay_two_level, as fp32 scales [tiles, K/32, 16]."""
    tiles, nb, _ = x.shape
    d = x[..., :32].contiguous().view(torch.float16).float()  # [tiles, nb, 16]
    c = x[..., 32:].reshape(tiles, nb, 8, 16).float()
    return (d[:, :, None, :] * c).reshape(tiles, nb * 8, 16)


def unpack(pw: PackedWeight) -> QuantMatrix:
    """The inverse of pack (tests; the torch fallback)."""
    tiles, k, g = pw.q.shape[0], pw.k, pw.group
    if pw.bits == 8:
        q = pw.q.reshape(tiles, k // 4, 16, 4).permute(0, 2, 1, 3).reshape(tiles * 16, k)
    else:
        b = pw.q.reshape(tiles, k // 8, 16, 4).permute(0, 2, 1, 3)  # [tiles, 16, K/8, 4]
        q = torch.stack((b & 15, b >> 4), dim=3).reshape(tiles * 16, k)
    lay = lambda a: (_unlay_two_level(a) if pw.half == 2 else a).permute(0, 2, 1).reshape(  # noqa: E731
        tiles * 16, k // g)[: pw.n].float()
    return QuantMatrix(q[: pw.n].contiguous(), lay(pw.s).contiguous(),
                       None if pw.m is None else lay(pw.m).contiguous(), pw.z, g, pw.fmt)


def quantize_activations(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row and group of `group`: int8 values (as fp32) and scales, as the kernel does."""
    xg = x.float().reshape(x.shape[0], -1, group)
    d = xg.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    return torch.round(xg * inv[..., None]), d


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def qgemm(x: torch.Tensor, pw: PackedWeight, out: torch.Tensor | None = None,
          accumulate: bool = False, bias: torch.Tensor | None = None,
          precise: bool = False) -> torch.Tensor:
    """out[:, :N] (+)= x [M, K] fp32 @ W^T (+ bias). `out` may be a column slice of a wider
    row-major buffer (stride(1) == 1), so fused projections write side by side. `precise`:
    activations as two int8 terms (value + rounding residual), ~127x less rounding error."""
    m_rows = x.shape[0]
    if out is None:
        out = torch.empty(m_rows, pw.n, dtype=torch.float32)
        accumulate = False
    if m_rows == 0:
        return out
    lib = native.load()
    if lib is None or x.dtype != torch.float32 or x.stride(-1) != 1 or out.stride(-1) != 1:
        y = _qgemm_torch(x, pw, bias, precise)
        return out.add_(y) if accumulate else out.copy_(y)
    lib.agrt_qgemm(x.data_ptr(), m_rows, pw.k, x.stride(0), pw.q.data_ptr(), pw.s.data_ptr(),
                   _ptr(pw.m), pw.half, pw.z, pw.bits, pw.group, pw.n, out.data_ptr(), out.stride(0),
                   int(accumulate), _ptr(bias), int(precise))
    return out


def _qgemm_torch(x: torch.Tensor, pw: PackedWeight, bias: torch.Tensor | None,
                 precise: bool = False) -> torch.Tensor:
    x = x.reshape(-1, pw.k).float()
    if precise:
        xq, sx = quantize_activations(x, pw.group)
        resid = x - (xq * sx[..., None]).reshape(x.shape)
        both = _qgemm_torch(torch.cat([x, resid]), pw, None)
        y = both[: x.shape[0]] + both[x.shape[0]:]
        return y if bias is None else y + bias
    qm = unpack(pw)
    n, k, g = pw.n, pw.k, pw.group
    qw = (qm.q.to(torch.int32) - pw.z).float().reshape(n, k // g, g)
    xq, sx = quantize_activations(x, g)  # [M, ng, G], [M, ng]
    rows = []
    for a in range(0, xq.shape[0], 64):  # (the [M, N, ng] partial sums are large)
        dots = torch.einsum("mgj,ngj->mng", xq[a:a + 64], qw)
        v = qm.s[None] * dots
        if qm.m is not None:
            v = v + qm.m[None] * xq[a:a + 64].sum(-1)[:, None, :]
        rows.append((sx[a:a + 64, None, :] * v).sum(-1))
    y = torch.cat(rows)
    return y if bias is None else y + bias


def qrefine(x: torch.Tensor, pw: PackedWeight, y: torch.Tensor, k: int) -> torch.Tensor:
    """y [M, N] = qgemm(x, pw): its k largest values per row recomputed in place from the fp32
    activations x and the dequantized weight rows (the output head's argmax: see QLinear)."""
    lib = native.load()
    if lib is None or x.stride(-1) != 1 or y.stride(-1) != 1 or x.dtype != torch.float32:
        idx = y.topk(min(k, y.shape[1]), dim=-1).indices
        for r in range(y.shape[0]):
            y[r, idx[r]] = qrows(pw, idx[r]) @ x[r].float()
        return y
    lib.agrt_qrefine(x.data_ptr(), x.shape[0], pw.k, x.stride(0), pw.q.data_ptr(), pw.s.data_ptr(),
                     _ptr(pw.m), pw.half, pw.z, pw.bits, pw.group, pw.n, y.data_ptr(), y.stride(0), k)
    return y


def qrows(pw: PackedWeight, ids: torch.Tensor) -> torch.Tensor:
    """Dequantized rows `ids` of W [N, K] (a quantized embedding lookup) -> [len(ids), K]."""
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    lib = native.load()
    if lib is None:
        qm = unpack(pw)
        sub = QuantMatrix(qm.q[ids], qm.s[ids], None if qm.m is None else qm.m[ids], pw.z, pw.group)
        return sub.dequantize()
    out = torch.empty(ids.numel(), pw.k, dtype=torch.float32)
    lib.agrt_qrows(pw.q.data_ptr(), pw.s.data_ptr(), _ptr(pw.m), pw.half, pw.z, pw.bits, pw.group, pw.k,
                   ids.data_ptr(), ids.numel(), out.data_ptr())
    return out


def quantize_int8(w: torch.Tensor, group: int | None = None) -> QuantMatrix:
    """Symmetric int8 per group (the Q8_0 scheme) from a float matrix [N, K]; the group is 32,
    or the largest of 16/8/4 that divides K."""
    n, k = w.shape
    group = group or next((g for g in (32, 16, 8, 4) if k % g == 0), 0)
    if not group or k % group:
        raise ConfigError(f"int8 quantization needs K ({k}) divisible by 4 (and by the group)")
    wg = w.detach().float().reshape(n, k // group, group)
    d = wg.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = (torch.round(wg * inv[..., None]).clamp(-127, 127) + 128).to(torch.uint8).reshape(n, k)
    return QuantMatrix(q, d, None, 128, group, "int8")


__all__ = ["QuantMatrix", "PackedWeight", "pack", "unpack", "qgemm", "qrefine", "qrows", "quantize_int8",
           "quantize_activations"]
