"""Each triton kernel against its torch reference. On CPU they run in triton's interpreter
(TRITON_INTERPRET=1, set before triton compiles anything); on a GPU, natively."""

from __future__ import annotations

import copy

import pytest
import torch

CUDA = torch.cuda.is_available()

triton = pytest.importorskip("triton")
from agentrt.kernels import reference, triton_ops  # noqa: E402
from agentrt.kernels.backends import get_backend  # noqa: E402
from agentrt.model.batch import SeqChunk, build_batch  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


def _err_rule(got, ref_lowp, ref_fp32):
    """flash-attention rule: a low-precision kernel's error vs the fp32 reference is at most
    twice that of the same-dtype torch computation (plus a tiny absolute floor)."""
    kernel_err = (got.float() - ref_fp32).abs().max().item()
    torch_err = (ref_lowp.float() - ref_fp32).abs().max().item()
    return kernel_err <= 2 * torch_err + 1e-5


@pytest.mark.parametrize("shape", [(1, 7), (3, 1000), (5, 4099)])
def test_argmax_matches_torch_including_ties(shape):
    x = torch.randn(shape, device=DEV)
    x[0, shape[1] // 2] = x[0, 0] = 50.0  # a tie: the lowest index wins, as in torch
    assert torch.equal(triton_ops.argmax(x), torch.argmax(x, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_reference(dtype):
    g = torch.Generator().manual_seed(0)
    caches = [torch.zeros(6, 4, 3, 10, dtype=dtype, device=DEV) for _ in range(4)]
    k, v = torch.randn(9, 3, 10, generator=g).to(DEV), torch.randn(9, 3, 10, generator=g).to(DEV)
    slots = torch.tensor([0, 5, 6, 7, 13, 22, 23, 2, 17], device=DEV)
    triton_ops.store_kv(caches[0], caches[1], k, v, slots)
    reference.store_kv(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def _paged_setup(dtype, page=8, heads=6, kv_heads=2, d=16, lens=(1, 9, 30, 17)):
    g = torch.Generator().manual_seed(1)
    n_pages = sum(-(-n // page) for n in lens) + 3
    kc = torch.randn(n_pages, page, kv_heads, d, generator=g).to(dtype).to(DEV)
    vc = torch.randn(n_pages, page, kv_heads, d, generator=g).to(dtype).to(DEV)
    perm = torch.randperm(n_pages, generator=g).tolist()  # pages scattered, not in order
    chunks, at = [], 0
    for n in lens:
        k = -(-n // page)
        chunks.append(SeqChunk([0], n - 1, perm[at:at + k]))
        at += k
    fb = build_batch(chunks, page)
    q = torch.randn(len(lens), heads, d, generator=g).to(dtype).to(DEV)
    return q, kc, vc, fb.meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_matches_reference(dtype):
    q, kc, vc, meta = _paged_setup(dtype)
    meta = meta.to(DEV)
    scale = 16 ** -0.5
    got = triton_ops.paged_attention(q, kc, vc, meta, scale)
    ref = reference.paged_attention(q, kc, vc, meta, scale)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    else:
        ref32 = reference.paged_attention(q.float(), kc.float(), vc.float(), meta, scale)
        assert _err_rule(got, ref, ref32)


def _mixed_setup(dtype, page, heads, kv_heads, d, rows):
    """rows: (cached, new) per sequence: `new` tokens after `cached` ones (decode: new = 1)."""
    g = torch.Generator().manual_seed(2)
    per = [-(-(c + n) // page) for c, n in rows]
    n_pages = sum(per) + 2
    kc = torch.randn(n_pages, page, kv_heads, d, generator=g).to(dtype).to(DEV)
    vc = torch.randn(n_pages, page, kv_heads, d, generator=g).to(dtype).to(DEV)
    perm = torch.randperm(n_pages, generator=g).tolist()
    chunks, at = [], 0
    for (c, n), k in zip(rows, per):
        chunks.append(SeqChunk(list(range(n)), c, perm[at:at + k], want_logits=n))
        at += k
    meta = build_batch(chunks, page).meta.to(DEV)
    q = torch.randn(meta.num_tokens, heads, d, generator=g).to(dtype).to(DEV)
    return q, kc, vc, meta


MIXED = [(0, 1), (40, 1), (17, 5), (0, 9), (3, 70), (100, 1), (30, 24)]  # decode, chunks, a long row


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 6, 2, 16), (16, 9, 3, 64), (8, 8, 8, 24)])  # page, H, Hkv, D
@pytest.mark.parametrize("window,softcap", [(0, 0.0), (11, 0.0), (0, 5.0)])
def test_token_attention_over_a_mixed_batch_matches_reference(dtype, shape, window, softcap):
    """Decode rows, short chunks after a cached prefix and a long row in one batch: the short
    rows' tokens go through the split kernel, the long row through SDPA; GQA groups of 3 (padded
    to 4), 1 and 1, a head dim that is no power of two, a sliding window, a softcap."""
    q, kc, vc, meta = _mixed_setup(dtype, *shape, MIXED)
    assert meta.long_rows == (4,) and meta.short_max_kv == 101
    scale = shape[3] ** -0.5
    got = triton_ops.paged_attention(q, kc, vc, meta, scale, window, softcap)
    ref = reference.paged_attention(q, kc, vc, meta, scale, window, softcap)
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    else:
        ref32 = reference.paged_attention(q.float(), kc.float(), vc.float(), meta, scale, window, softcap)
        assert _err_rule(got, ref, ref32)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (11, 0.0), (0, 5.0)])
def test_fixed_split_attention_is_the_same_for_a_token_alone_and_matches_reference(window, softcap):
    """The batch-invariant mode: every row token by token (short_limit=None, the long row too),
    keys split in fixed runs (16 here: several splits a token) folded in order; each token's
    output equals its own launch alone, bit for bit, and the reference within fp32 rounding."""
    from agentrt.kernels.triton_attention import token_attention

    page, heads, hkv, d = 4, 6, 2, 16
    q, kc, vc, _ = _mixed_setup(torch.float32, page, heads, hkv, d, MIXED)
    g = torch.Generator().manual_seed(2)
    per = [-(-(c + n) // page) for c, n in MIXED]
    perm = torch.randperm(sum(per) + 2, generator=g).tolist()
    chunks, at = [], 0
    for (c, n), k in zip(MIXED, per):
        chunks.append(SeqChunk(list(range(n)), c, perm[at:at + k], want_logits=n))
        at += k
    meta = build_batch(chunks, page, short_limit=None).meta.to(DEV)
    assert meta.long_rows == () and meta.short_tok.numel() == meta.num_tokens
    scale = d ** -0.5
    got = triton_ops.paged_attention(q, kc, vc, meta, scale, window, softcap, chunk=16)
    ref = reference.paged_attention(q, kc, vc, build_batch(chunks, page).meta.to(DEV), scale, window, softcap)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=2e-5)
    for t in (0, 7, 60, meta.num_tokens - 1):  # (a decode token, chunk tokens, the long row's)
        one = token_attention(q[t:t + 1], kc, vc, meta.page_table, meta.short_seq[t:t + 1],
                              meta.short_lens[t:t + 1], scale, window, softcap, int(meta.short_lens[t]), 16)
        assert torch.equal(one[0], got[t])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 96), (3, 7, 64), (1, 100)])
def test_rms_norm_matches_reference(dtype, shape):
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(shape, generator=g)).to(dtype).to(DEV)
    w = torch.randn(shape[-1], generator=g).to(dtype).to(DEV)
    got, ref = triton_ops.rms_norm(x, w, 1e-5), reference.rms_norm(x, w, 1e-5)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5) if dtype == torch.float32 else \
        torch.testing.assert_close(got, ref, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,d", [(6, 16), (2, 64), (3, 10)])
def test_rope_matches_reference(dtype, heads, d):
    from agentrt.model.rope import RopeTable

    table = RopeTable(d, 64, 10000.0)
    pos = torch.tensor([0, 5, 9, 63, 17])
    g = torch.Generator().manual_seed(4)
    x = torch.randn(len(pos), heads, d, generator=g).to(dtype).to(DEV)
    cos, sin = table.cos[pos].to(DEV), table.sin[pos].to(DEV)
    got, ref = triton_ops.rope(x, cos, sin), reference.rope(x, cos, sin)
    assert got.dtype == x.dtype
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5) if dtype == torch.float32 else \
        torch.testing.assert_close(got, ref, atol=1e-2, rtol=1e-2)


def test_split_counts_fill_the_device_and_stay_powers_of_two():
    from agentrt.kernels.triton_attention import splits_for

    assert splits_for(1, 8, 4096, 32) == 32 and splits_for(1, 8, 100, 32) == 4
    assert splits_for(64, 8, 4096, 32) == 1 and splits_for(3, 3, 4096, 32) == 32
    assert all(s & (s - 1) == 0 for s in (splits_for(t, 3, 999, 16) for t in range(1, 40)))


def test_backend_choice_and_override():
    assert get_backend("torch").name == "torch"
    assert get_backend("auto", "cpu").name == "torch"
    with pytest.raises(Exception):
        get_backend("cuda-magic")


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_triton_backend_runs_a_model_step_on_gpu():
    from agentrt.model.generate import prompt_logits
    from tests.conftest import tiny_model

    model = copy.deepcopy(tiny_model("llama"))  # (the cached model stays on the CPU for other tests)
    ref = prompt_logits(model, list(range(40)))
    model.ops = get_backend("triton", "cuda")
    got = prompt_logits(model.cuda(), list(range(40))).cpu()
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)


def test_the_thread_that_hands_over_the_compute_gives_up_its_openmp_workers():
    """kernels/native.py::release_thread_pool, which StepThread.start calls: two libgomp pools
    (the event loop's thread and the step thread) hold more threads than CPUs, and libgomp then
    stops spin-waiting between parallel regions. The caller's workers must be gone after it."""
    import os
    import time

    import torch

    from agentrt.kernels import native

    if native._omp_pause() is None or torch.get_num_threads() < 2 or not os.path.isdir("/proc/self/task"):
        pytest.skip("torch does not run on libgomp with 2+ threads here")
    x = torch.randn(1 << 22)
    for _ in range(3):
        (x * 2.0).sum()  # a parallel region on this thread: its pool of workers
    before = len(os.listdir("/proc/self/task"))
    assert native.release_thread_pool()
    deadline = time.monotonic() + 5.0
    while len(os.listdir("/proc/self/task")) >= before and time.monotonic() < deadline:
        time.sleep(0.01)  # (the workers exit on their own)
    assert len(os.listdir("/proc/self/task")) <= before - (torch.get_num_threads() - 1)
