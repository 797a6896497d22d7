"""Tensor placement without a GPU: the `meta` device as the oracle of a GPU run.

A tensor left on the host beside a model on another device fails on a GPU at its first use
("expected all tensors to be on the same device"). On the `meta` device most of those ops raise
the same way, so the forward of a model moved to `meta`, over batches moved by the engine's own
staging, finds a host-made mask or index without a GPU. A walk of every batch also checks that
no tensor reachable from it stays on the host after the move."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from agentrt.kernels import reference
from agentrt.kernels.backends import get_backend
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.staging import HostStaging
from tests.conftest import tiny_model

PS = 4


def reachable_tensors(obj, seen=None):
    """Every tensor reachable from a (nested) frozen dataclass of tensors and tuples."""
    seen = seen if seen is not None else set()
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from reachable_tensors(getattr(obj, f.name), seen)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from reachable_tensors(x, seen)


def mixed_chunks():
    """A prefill after a cached prefix, a whole prompt, and two decode rows."""
    return [SeqChunk(list(range(10, 16)), 5, [0, 1, 2]), SeqChunk(list(range(3, 10)), 0, [3, 4]),
            SeqChunk([7], 9, [5, 6, 7]), SeqChunk([8], 2, [8])]


@pytest.mark.parametrize("local", [False, True])
def test_no_tensor_of_a_moved_batch_stays_on_the_host(local):
    local_of = torch.arange(9, dtype=torch.int64) if local else None
    fb = build_batch(mixed_chunks(), PS, local_of)
    assert (fb.meta.local is not None) == local
    moved = fb.to("meta", HostStaging("meta"))
    tensors = list(reachable_tensors(moved))
    assert len(tensors) == len(fb.tensors()) and all(t.device.type == "meta" for t in tensors)
    # the move keeps every shape and the order of the fields
    assert [t.shape for t in moved.tensors()] == [t.shape for t in fb.tensors()]
    # and the values, through the one packed copy
    back = HostStaging("cpu").move(fb.tensors())
    assert all(torch.equal(a, b) for a, b in zip(back, fb.tensors()))


def test_the_meta_oracle_catches_a_host_mask():
    """The oracle can fail: the kind of op that failed on the H200 (a host mask applied to the
    device's scores) raises on `meta` too."""
    scores = torch.zeros(2, 3, device="meta")
    with pytest.raises(RuntimeError, match="device"):
        scores.masked_fill(torch.ones(2, 3, dtype=torch.bool), float("-inf"))


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (0, 30.0), (5, 30.0)])
def test_reference_attention_makes_its_masks_on_the_queries_device(window, softcap):
    fb = build_batch(mixed_chunks(), PS).to("meta", HostStaging("meta"))
    h, hkv, d = 4, 2, 8
    cache = torch.zeros(9, PS, hkv, d, device="meta")
    q = torch.zeros(fb.meta.num_tokens, h, d, device="meta")
    out = reference.paged_attention(q, cache, cache, fb.meta, 0.3, window, softcap)
    assert out.device.type == "meta" and out.shape == q.shape


def test_model_forward_on_meta_over_an_engine_batch():
    model = copy.deepcopy(tiny_model("llama")).to("meta")
    model.ops = get_backend("torch")  # (the reference kernels: the ones a GPU runs for prefill)
    assert model.device.type == "meta"
    store = KVStore.allocate(model.cfg, 9, PS, model.kv_dtype, device=model.device)
    staging = HostStaging(model.device)
    for chunks in (mixed_chunks(), [SeqChunk([5], 3, [0]), SeqChunk([6], 7, [1, 2])]):
        fb = build_batch(chunks, PS).to(model.device, staging)
        logits = model(fb.input_ids, fb.positions, store, fb.meta, fb.logits_rows, path="eager")
        assert logits.device.type == "meta" and logits.shape == (len(chunks), model.cfg.vocab_size)
