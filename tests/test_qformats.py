"""Quantized weights: GGUF repacking is exact, the GEMM kernel stays within the bound that
activation rounding implies, and the compiled kernel, its torch fallback and the float
reference agree."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from agentrt.kernels import native
from agentrt.kernels.packing import QuantMatrix, pack, qgemm, qrows, quantize_activations, quantize_int8, unpack
from agentrt.model.loaders.gguf_quant import BLOCK, unpack_gguf

WITH_QUANTIZER = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)


def _k_blocks(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random K-quant blocks with finite fp16 super-block scales (gguf has no K quantizer)."""
    size, nbytes = BLOCK[qtype]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    d = rng.uniform(1e-3, 0.05, (blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if qtype == T.Q6_K:
        blocks[:, 208:210] = d[:, :2]
    else:
        blocks[:, 0:4] = d
    return blocks.reshape(rows, -1)


def _gguf_matrix(qtype, rows=48, cols=512, seed=0):
    rng = np.random.default_rng(seed)
    if qtype in WITH_QUANTIZER:
        data = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), qtype)
    else:
        data = _k_blocks(qtype, rows, cols, rng)
    return data, unpack_gguf(data, qtype, rows, cols)


@pytest.mark.parametrize("qtype", WITH_QUANTIZER + K_QUANTS, ids=lambda q: q.name)
def test_repacked_gguf_dequantizes_exactly_like_gguf(qtype):
    data, qm = _gguf_matrix(qtype)
    ref = torch.from_numpy(gguf.quants.dequantize(data, qtype).reshape(qm.shape).astype(np.float32))
    assert torch.equal(qm.dequantize(), ref)
    back = unpack(pack(qm))  # the tiled layout loses nothing
    assert torch.equal(back.dequantize(), ref)
    assert back.q.dtype == torch.uint8 and pack(qm).bits == (4 if qtype in (T.Q4_0, T.Q4_1, T.Q4_K) else 8)


def _bound(x: torch.Tensor, w: torch.Tensor, group: int) -> torch.Tensor:
    """|x.w - kernel| <= sum_g (amax_g(x) / 254) * sum_{k in g} |w_k| + float rounding."""
    _, d = quantize_activations(x, group)  # d = amax / 127 per row and group
    absw = w.abs().reshape(w.shape[0], -1, group).sum(-1)  # [N, ng]
    act = (d / 2) @ absw.T
    return act * 1.001 + 1e-4 * (x.abs() @ w.abs().T) + 1e-5


@pytest.mark.parametrize("qtype", (T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0), ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
def test_qgemm_within_the_activation_rounding_bound(qtype, rows):
    _, qm = _gguf_matrix(qtype, rows=40, cols=512, seed=rows)
    pw, w = pack(qm), qm.dequantize()
    x = torch.randn(rows, 512)
    ref = x.double() @ w.double().T
    for fallback in (False, True):
        y = _with_native(fallback, lambda: qgemm(x, pw))
        assert y.shape == (rows, 40)
        assert ((y.double() - ref).abs() <= _bound(x, w, qm.group).double()).all(), fallback


def _with_native(disabled: bool, fn):
    if not disabled:
        return fn()
    mp = pytest.MonkeyPatch()
    mp.setenv("AGENTRT_NATIVE", "0")
    try:
        assert native.load() is None
        return fn()
    finally:
        mp.undo()


@pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
def test_compiled_kernel_matches_torch_fallback_and_is_batch_invariant():
    torch.manual_seed(0)
    q = torch.randint(0, 16, (70, 576), dtype=torch.uint8)  # 70: a partly filled last tile
    qm = QuantMatrix(q, torch.rand(70, 18), torch.randn(70, 18), 0, 32)
    pw = pack(qm)
    assert pw.bits == 4
    x = torch.randn(11, 576)
    bias = torch.randn(70)
    y = qgemm(x, pw, bias=bias)
    yf = _with_native(True, lambda: qgemm(x, pw, bias=bias))
    assert torch.allclose(y, yf, rtol=1e-5, atol=1e-4)
    for r in range(11):  # a row's result does not depend on the other rows of the call
        assert torch.equal(qgemm(x[r:r + 1], pw, bias=bias), y[r:r + 1])
    out = torch.ones(11, 100)  # accumulate into a column slice of a wider buffer
    qgemm(x, pw, out[:, 10:80], accumulate=True, bias=bias)
    assert torch.allclose(out[:, 10:80], y + 1, atol=1e-5) and (out[:, :10] == 1).all() and (out[:, 80:] == 1).all()


@pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
@pytest.mark.parametrize("bits,group,zero,mins,half", [(4, 32, 0, True, False), (8, 32, 0, False, True),
                                                       (8, 16, 32, False, False), (4, 32, 8, False, True)])
def test_every_row_count_gives_each_row_the_single_row_bits(bits, group, zero, mins, half):
    """One row runs the VNNI kernel; 8-bit weights at 32-128 rows the AMX kernel where the CPU
    grants it (else VNNI again): the same bits per row at every count, across row blocks and the
    tile-major switch."""
    torch.manual_seed(bits + group)
    n, k = 50, 192
    q = torch.randint(0, 2 ** bits, (n, k), dtype=torch.uint8)
    s = torch.rand(n, k // group)
    pw = pack(QuantMatrix(q, s.half().float() if half else s, torch.randn(n, k // group) if mins else None,
                          zero, group))
    x, bias = torch.randn(129, k) * 3, torch.randn(n)
    singles = torch.cat([qgemm(x[r:r + 1], pw, bias=bias) for r in range(129)])
    for m in (2, 5, 16, 17, 33, 64, 65, 70, 128, 129):
        assert torch.equal(qgemm(x[:m], pw, bias=bias), singles[:m]), m
    ref = _with_native(True, lambda: qgemm(x, pw, bias=bias))  # (the torch fallback)
    torch.testing.assert_close(singles, ref, rtol=1e-4, atol=1e-5 * ref.abs().max().item())
    print("AMX kernel:", bool(native.load().agrt_has_amx()))


@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q5_K), ids=lambda q: q.name)
def test_k_quant_scales_keep_their_two_levels(qtype):
    """Q4_K/Q5_K scales and mins packed as the file has them (fp16 d per 256, 8-bit sub-scales):
    fewer bytes, and bitwise the same GEMM and rows as the fp32 scales they equal."""
    import dataclasses

    from agentrt.kernels.packing import _unlay_two_level

    _, qm = _gguf_matrix(qtype, rows=40, cols=512, seed=5)
    pw = pack(qm)
    assert pw.half == 2 and pw.s.dtype == torch.uint8
    flat = dataclasses.replace(pw, s=_unlay_two_level(pw.s).contiguous(), m=_unlay_two_level(pw.m).contiguous())
    assert flat.half == 0 and pw.nbytes < (0.8 if pw.bits == 4 else 0.9) * flat.nbytes
    assert torch.equal(unpack(pw).s, qm.s) and torch.equal(unpack(pw).m, qm.m)
    for rows in (1, 3, 8, 13):
        x = torch.randn(rows, 512)
        for fallback in (False, True):
            assert torch.equal(_with_native(fallback, lambda: qgemm(x, pw)),
                               _with_native(fallback, lambda: qgemm(x, flat))), (rows, fallback)
    ids = torch.tensor([0, 17, 39])
    assert torch.equal(qrows(pw, ids), qrows(flat, ids))


@pytest.mark.parametrize("fallback", [False, True])
def test_quantized_row_lookup_is_exact(fallback):
    _, qm = _gguf_matrix(T.Q8_0, rows=40, cols=64)
    ids = torch.tensor([0, 17, 39, 17])
    rows = _with_native(fallback, lambda: qrows(pack(qm), ids))
    assert torch.equal(rows, qm.dequantize()[ids])


def test_int8_quantization_of_dense_weights():
    torch.manual_seed(1)
    w = torch.randn(50, 96)
    qm = quantize_int8(w)
    err = (qm.dequantize() - w).abs().reshape(50, 3, 32)
    assert (err <= w.abs().reshape(50, 3, 32).amax(-1, keepdim=True) / 254 + 1e-7).all()
    assert qgemm(torch.zeros(0, 96), pack(qm)).shape == (0, 50)


_PORTABLE_CHECK = """
import torch
from agentrt.kernels import native
from agentrt.kernels.packing import QuantMatrix, pack, qgemm, _qgemm_torch
from agentrt.model.generate import prompt_logits
from tests.conftest import tiny_model
assert native.load().agrt_has_vnni() == 0
torch.manual_seed(0)
for q, s, m, z, g in ((torch.randint(0, 16, (40, 64), dtype=torch.uint8), torch.rand(40, 2), torch.randn(40, 2), 0, 32),
                      (torch.randint(0, 64, (40, 64), dtype=torch.uint8), torch.rand(40, 4), None, 32, 16)):
    pw = pack(QuantMatrix(q, s, m, z, g))
    x = torch.randn(5, 64)
    assert torch.allclose(qgemm(x, pw, precise=True), _qgemm_torch(x, pw, None, True), atol=1e-4)
d = torch.rand(40, 2).half().float()  # K-quant scales (d x 6-bit): the two-level layout
pw = pack(QuantMatrix(torch.randint(0, 16, (40, 512), dtype=torch.uint8), d.repeat_interleave(8, 1) *
                      torch.randint(0, 64, (40, 16)).float(), -d.repeat_interleave(8, 1) * 3, 0, 32, "Q4_K"))
assert pw.half == 2
x = torch.randn(5, 512)
assert torch.allclose(qgemm(x, pw, precise=True), _qgemm_torch(x, pw, None, True), atol=1e-4)
model = tiny_model("qwen2")
ids = list(range(3, 90))
assert torch.allclose(prompt_logits(model, ids, path="fused"), prompt_logits(model, ids, path="eager"), atol=1e-4)
print("portable ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
def test_portable_kernels_without_avx512(tmp_path):
    """The loops a CPU without AVX-512 runs: built with -mno-avx512f in a fresh process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, AGENTRT_KERNEL_CFLAGS="-mno-avx512f", AGENTRT_KERNEL_CACHE=str(tmp_path),
               PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", _PORTABLE_CHECK], env=env, cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and "portable ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("native_on", [True, False])
def test_qrefine_recomputes_each_rows_top_k_from_fp32_activations(native_on, monkeypatch):
    """The output head's refinement: each row's k largest int8-activation logits become the
    exact x . w of the dequantized rows; every other logit is untouched (compiled kernel and
    torch fallback alike)."""
    from agentrt.kernels.packing import qrefine

    if not native_on:
        monkeypatch.setenv("AGENTRT_NATIVE", "0")
    g = torch.Generator().manual_seed(3)
    pw = pack(quantize_int8(torch.randn(300, 64, generator=g)))
    x = torch.randn(4, 64, generator=g)
    y0 = qgemm(x, pw)
    y = qrefine(x, pw, y0.clone(), 8)
    exact = x @ qrows(pw, torch.arange(300)).T
    for r in range(4):
        top = y0[r].topk(8).indices
        torch.testing.assert_close(y[r, top], exact[r, top], atol=1e-4, rtol=1e-5)
        rest = torch.ones(300, dtype=torch.bool)
        rest[top] = False
        assert torch.equal(y[r, rest], y0[r, rest])


@pytest.mark.parametrize("width", [49152, 100, 33])
def test_bitmask_kernel_matches_the_numpy_path(width):
    """Grammar masks applied by the compiled kernel == the unpacked-bits reference, for random,
    all-ones, all-zero and single-bit words, and a vocabulary that ends mid-word."""
    from agentrt.constrain.masks import apply_bitmask

    g = torch.Generator().manual_seed(width)
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (1, -(-width // 32)), dtype=torch.int32, generator=g)
    words[0, 0], words[0, -1] = -1, 0
    if words.shape[1] > 2:
        words[0, 1] = 1 << 5
    x = torch.randn(width, generator=g)
    bits = np.unpackbits(words.numpy()[0].view(np.uint8), count=width, bitorder="little").astype(bool)
    want = x.masked_fill(~torch.from_numpy(bits), float("-inf"))
    for fallback in (False, True):
        got = x.clone()
        _with_native(fallback, lambda: apply_bitmask(got, words))
        assert torch.equal(got, want), fallback
