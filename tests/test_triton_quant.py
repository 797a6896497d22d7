"""The GPU's quantized GEMM (kernels/triton_quant.py) against the CPU dequantization of the same
GGUF blocks: every format, decode rows and prefill rows, and a row's result the same alone, in a
batch and in a prefill chunk (batch invariance). On CPU the kernel runs in triton's interpreter
(TRITON_INTERPRET=1, set before triton compiles anything); on a GPU, natively."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

CUDA = torch.cuda.is_available()

triton = pytest.importorskip("triton")
from agentrt.kernels import triton_quant  # noqa: E402
from agentrt.model.device_quant import DeviceQEmbedding, DeviceQLinear, DeviceWeight  # noqa: E402
from tests.test_qformats import _gguf_matrix  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
FORMATS = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)


def _weight(qtype, rows=40, cols=512, seed=0):
    data, qm = _gguf_matrix(qtype, rows, cols, seed)  # (gguf's quantizer, or random K-quant blocks)
    ref = qm.dequantize()  # the CPU's dequantization of the same blocks
    return DeviceWeight.from_blocks(data, qtype, rows, cols).to(DEV), ref


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_planes_dequantize_exactly_like_the_cpu(qtype):
    w, ref = _weight(qtype)
    assert torch.equal(w.dequantize().cpu(), ref)
    ids = torch.tensor([0, 39, 7, 7], device=DEV)
    rows = triton_quant.rows(w.planes(), ids, torch.float32)  # the kernel's own dequantization
    assert torch.equal(rows.cpu(), ref[ids.cpu()])


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 5, 37])
def test_quantized_matmul_matches_the_dequantized_product(qtype, m):
    w, ref = _weight(qtype)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    want = x.double() @ ref.double().t()
    got = triton_quant.matmul(x.to(DEV), w.planes(), invariant=False).cpu()
    scale = (x.abs().double() @ ref.abs().double().t()).max()
    tol = 4e-3 if CUDA else 1e-6  # (CUDA: bf16 products; the interpreter: fp32)
    assert ((got.double() - want).abs().max() / scale) < tol


def test_a_rows_result_is_the_same_alone_batched_and_in_a_prefill_chunk():
    w, _ = _weight(T.Q4_K, rows=70, cols=768, seed=3)
    x = torch.randn(33, 768, generator=torch.Generator().manual_seed(1)).to(DEV)
    p = w.planes()
    alone = torch.cat([triton_quant.matmul(x[i:i + 1], p) for i in range(x.shape[0])])
    batched = torch.cat([triton_quant.matmul(x[i:i + 8], p) for i in range(0, 33, 8)])
    chunk = triton_quant.matmul(x, p)
    assert torch.equal(alone, batched) and torch.equal(alone, chunk)
    # on a GPU the same holds because the tiles (and so every row's reduction) ignore M
    assert len({triton_quant.tiles(p, m, invariant=True) for m in (1, 8, 33, 2048)}) == 1


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda q: q.name)
def test_a_narrow_layer_splits_k_and_folds_the_runs_in_order(qtype):
    w, ref = _weight(qtype, rows=40, cols=2048, seed=5)
    p = w.planes()
    assert triton_quant.tiles(p, 1, invariant=True)[3] == 4  # (40 columns: few programs without a split)
    x = torch.randn(20, 2048, generator=torch.Generator().manual_seed(6))
    bias = torch.randn(40, generator=torch.Generator().manual_seed(7))
    got = triton_quant.matmul(x.to(DEV), p, bias=bias.to(DEV)).cpu()
    want = x.double() @ ref.double().t() + bias.double()
    scale = (x.abs().double() @ ref.abs().double().t()).max()
    assert ((got.double() - want).abs().max() / scale) < (4e-3 if CUDA else 1e-6)
    alone = torch.cat([triton_quant.matmul(x[i:i + 1].to(DEV), p, bias=bias.to(DEV)) for i in (0, 13, 19)]).cpu()
    assert torch.equal(alone, got[[0, 13, 19]])


def test_dense_weights_run_the_same_kernel_invariantly():
    g = torch.Generator().manual_seed(2)
    wd = torch.randn(50, 96, generator=g)
    dw = DeviceWeight.dense(wd).to(DEV)
    x = torch.randn(19, 96, generator=g).to(DEV)
    got = triton_quant.matmul(x, dw.planes())
    assert torch.allclose(got.cpu(), x.cpu() @ wd.t(), rtol=1e-4 if not CUDA else 2e-2, atol=1e-4 if not CUDA else 5e-2)
    assert torch.equal(got[3:4], triton_quant.matmul(x[3:4], dw.planes()))


def test_fused_layer_and_embedding_in_the_kernel_match_torch():
    parts = [DeviceWeight.from_blocks(_gguf_matrix(q, r, 256, i)[0], q, r, 256)
             for i, (q, r) in enumerate([(T.Q4_K, 32), (T.Q4_K, 16), (T.Q6_K, 16)])]
    lin = DeviceQLinear.fused(parts, bias=torch.randn(64)).to(DEV)
    assert len(lin.parts) == 2 and lin.n_out == 64  # (the two Q4_K parts became one matrix)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(DEV)
    lin.impl = "torch"
    ref = lin(x)
    lin.impl = "triton"
    assert torch.allclose(lin(x), ref, rtol=1e-5, atol=1e-4 if not CUDA else 5e-2)
    emb = DeviceQEmbedding(parts[0], torch.float32).to(DEV)
    ids = torch.tensor([[1, 31], [0, 2]], device=DEV)
    emb.impl = "torch"
    ref = emb(ids)
    emb.impl = "triton"
    assert emb(ids).shape == (2, 2, 256) and torch.equal(emb(ids), ref)


def test_an_unsupported_format_is_a_clear_error():
    from agentrt.errors import ConfigError

    with pytest.raises(ConfigError, match="Q2_K has no GPU kernel"):
        DeviceWeight.from_blocks(np.zeros((1, 84), np.uint8), T.Q2_K, 1, 256)


def test_q4k_planes_are_about_the_files_bytes():
    w, _ = _weight(T.Q4_K, rows=64, cols=1024)
    file_bytes = 64 * 1024 // 256 * 144
    assert w.nbytes <= file_bytes * 1.03
