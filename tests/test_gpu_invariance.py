"""The GPU's batch-invariant mode, end to end on the triton backend (on CPU in triton's
interpreter): a sequence's logits are bit for bit the same computed alone, batched with other
sequences of other lengths, and after a cached prefix (a radix hit: only its suffix computed),
because every GEMM's tiles and every token's attention split ignore the rest of the step
(kernels/triton_quant.py, kernels/triton_attention.py). The oracle is the same model alone."""

from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()

pytest.importorskip("triton")
from agentrt.kernels.triton_ops import TritonBackend  # noqa: E402
from agentrt.kv.store import KVStore  # noqa: E402
from agentrt.model import device_quant  # noqa: E402
from agentrt.model.batch import SeqChunk, build_batch  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

PS = 8
DEV = "cuda" if CUDA else "cpu"


@pytest.fixture(scope="module")
def model():
    m = tiny_model("llama", seed=2).to(DEV)
    m.ops = TritonBackend()
    device_quant.place(m, invariant=True)
    m.forward_path = "eager"
    return m


def _run(model, store, chunks):
    fb = build_batch(chunks, PS, short_limit=model.short_limit).to(model.device)
    return model(fb.input_ids, fb.positions, store, fb.meta, fb.logits_rows)


def test_the_invariant_mode_replaces_every_dense_layer_and_fixes_the_split(model):
    assert isinstance(model.blocks[0].attn.qkv, device_quant.DeviceQLinear)
    assert isinstance(model.lm_head, device_quant.DeviceQLinear) and model.lm_head.invariant
    assert model.ops.invariant_chunk >= 256 and model.short_limit is None


def test_logits_alone_batched_and_after_a_cached_prefix_are_identical(model):
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (23, 9, 40)]
    store = KVStore.allocate(model.cfg, 40, PS, device=model.device)
    pages = [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    alone_prefill = _run(model, store, [SeqChunk(seqs[0], 0, pages[0])])
    alone_decode = _run(model, store, [SeqChunk([17], 23, pages[0])])
    # the same sequence again, its first 16 tokens cached (copied pages), its suffix in a batch
    # with another prompt and a third sequence's prefill
    hit = list(range(24, 32))
    for layer in range(len(store.k)):
        store.k[layer][hit[:2]] = store.k[layer][pages[0][:2]]
        store.v[layer][hit[:2]] = store.v[layer][pages[0][:2]]
    batch = _run(model, store, [SeqChunk(seqs[1], 0, pages[1]), SeqChunk(seqs[0][16:], 16, hit),
                                SeqChunk(seqs[2], 0, pages[2])])
    assert torch.equal(batch[1], alone_prefill[0])
    decode = _run(model, store, [SeqChunk([5], 9, pages[1]), SeqChunk([17], 23, hit), SeqChunk([6], 40, pages[2])])
    assert torch.equal(decode[1], alone_decode[0])


def test_the_invariant_model_matches_the_torch_reference(model):
    ref = tiny_model("llama", seed=2).to(DEV)
    ref.forward_path = "eager"
    prompt = list(range(3, 30))
    s1 = KVStore.allocate(model.cfg, 8, PS, device=model.device)
    s2 = KVStore.allocate(ref.cfg, 8, PS, device=ref.device)
    got = _run(model, s1, [SeqChunk(prompt, 0, list(range(4)), want_logits=len(prompt))])
    want = _run(ref, s2, [SeqChunk(prompt, 0, list(range(4)), want_logits=len(prompt))])
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
