"""The model against transformers on the same weights, and varlen/chunked-prefill equivalence."""

from __future__ import annotations

import pytest
import torch

from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.decoder import DecoderModel
from agentrt.model.generate import prompt_logits
from agentrt.model.loaders.hf import load_hf_dir
from tests.conftest import make_hf_model, tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_match_transformers_from_safetensors(arch, tmp_path):
    hf = make_hf_model(arch, seed=1)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    files = load_hf_dir(tmp_path, torch.float32)
    model = DecoderModel(files.config)
    model.load_hf_weights(files.weights)
    ids = torch.randint(0, files.config.vocab_size, (77,), generator=torch.Generator().manual_seed(3))
    ours = prompt_logits(model, ids.tolist())
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4


def _run_batch(model, seqs, page_size=16):
    """Prefill each sequence of `seqs` in one mixed batch; returns per-sequence logits."""
    kv = KVStore.allocate(model.cfg, 64, page_size)
    chunks, base = [], 0
    for s in seqs:
        n = -(-len(s) // page_size)
        chunks.append(SeqChunk(s, 0, list(range(base, base + n)), want_logits=len(s)))
        base += n
    fb = build_batch(chunks, page_size)
    logits = model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)
    return logits.split([len(s) for s in seqs]), kv, chunks


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_varlen_batch_equals_each_sequence_alone(arch):
    model = tiny_model(arch)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 301, (n,), generator=g).tolist() for n in (5, 40, 17)]
    batched, kv, chunks = _run_batch(model, seqs)
    for s, got in zip(seqs, batched):
        torch.testing.assert_close(got, prompt_logits(model, s), atol=1e-4, rtol=0)
    # then one decode token each, mixed with a new 9-token prefill, in one batch
    nxt = [int(x[-1].argmax()) for x in batched]
    extra = torch.randint(0, 301, (9,), generator=g).tolist()
    mixed = [SeqChunk([t], len(s), c.pages + [60]) for t, s, c in zip(nxt, seqs, chunks)]
    mixed.append(SeqChunk(extra, 0, [61]))
    fb = build_batch(mixed, 16)
    out = model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)
    for i, (s, t) in enumerate(zip(seqs, nxt)):
        torch.testing.assert_close(out[i], prompt_logits(model, s + [t])[-1], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[3], prompt_logits(model, extra)[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("chunk", [1, 7, 64, 256])
def test_chunked_prefill_equals_one_pass(chunk):
    """600 tokens: one pass takes the fused causal kernel, 256-token chunks the masked fused
    kernel, short chunks the explicit-matmul path: all must agree."""
    model = tiny_model("qwen2")
    page_size = 16
    prompt = torch.randint(0, 301, (600,), generator=torch.Generator().manual_seed(9)).tolist()
    kv = KVStore.allocate(model.cfg, 40, page_size)
    pages = list(range(38))
    parts = []
    for start in range(0, len(prompt), chunk):
        piece = prompt[start:start + chunk]
        fb = build_batch([SeqChunk(piece, start, pages, want_logits=len(piece))], page_size)
        parts.append(model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows))
    torch.testing.assert_close(torch.cat(parts), prompt_logits(model, prompt), atol=1e-4, rtol=0)
