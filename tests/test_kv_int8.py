"""The int8 KV store (load_model(kv_dtype="int8")): each (token, head) row quantized with its own
scale, amax / 127, kept after the row's bytes.

Oracles: the compiled store writes exactly the reference quantization (kernels/reference.py) of
what a float32 store holds; attention over an int8 store equals torch over its dequantized rows
(and each row the same bits in any chunk: tests/test_invariance.py); the engine's greedy tokens
equal `generate()` on the same store type across batching, chunking and radix hits; and on the
embedded SmolLM2 the teacher-forced greedy tokens agree with the float16 store's on >= 97% of
positions."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.kernels.reference import dequantize_kv, quantize_kv
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_native
from tests.test_invariance import _prompts, _run

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels are not built")


def _int8(arch: str = "llama"):
    m = copy.copy(tiny_native(arch))
    m.kv_dtype, m.fused_cache = torch.int8, {}
    return m


def test_quantize_round_trip_error_is_at_most_half_a_step_and_zero_rows_stay_zero():
    x = torch.randn(5, 3, 64) * torch.tensor([1e-3, 1.0, 40.0])[None, :, None]
    x[0, 0] = 0.0
    x[1, 1, 40] = 300.0  # (an outlier costs its own group of 32 only)
    rows = quantize_kv(x)
    assert rows.shape == (5, 3, 72) and rows.dtype == torch.int8
    step = x.unflatten(-1, (2, 32)).abs().amax(-1, keepdim=True).expand(5, 3, 2, 32).flatten(-2) / 127
    assert ((dequantize_kv(rows) - x).abs() <= step / 2 * 1.0001 + 1e-12).all()
    assert torch.equal(dequantize_kv(rows)[0, 0], torch.zeros(64))
    assert (dequantize_kv(rows)[1, 1, :32] - x[1, 1, :32]).abs().max() <= x[1, 1, :32].abs().max() / 254 * 1.0001
    for d in (12, 48, 64, 128, 256):  # (a short last group)
        y = torch.randn(4, d)
        assert quantize_kv(y).shape[-1] == d + 4 * -(-d // 32)
        assert (dequantize_kv(quantize_kv(y)) - y).abs().max() <= y.abs().max() / 254 * 1.0001
    assert KVStore.bytes_per_token(tiny_native().cfg, torch.int8) * 2 * 64 == \
        KVStore.bytes_per_token(tiny_native().cfg, torch.float16) * 72  # (D + 8) / 2D of float16


@pytest.mark.parametrize("path", ["fused", "eager"])
def test_the_store_holds_the_reference_quantization_of_the_float32_rows(path):
    """One prefill into a float32 store and into an int8 store: the first layer's int8 bytes
    are exactly quantize_kv of its float32 rows (its K and V come from the embeddings alone;
    later layers' inputs already differ by the attention over the quantized rows)."""
    m32, m8 = copy.copy(tiny_native()), _int8()
    m32.kv_dtype, m32.fused_cache = torch.float32, {}
    ids = list(range(3, 60))
    stores = []
    for m in (m32, m8):
        kv = KVStore.allocate(m.cfg, 8, 16, m.kv_dtype)
        fb = build_batch([SeqChunk(ids, 0, list(range(4)))], 16)
        with torch.inference_mode():
            m(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path)
        stores.append(kv)
    n = len(ids)
    for a, b in ((stores[0].k[0], stores[1].k[0]), (stores[0].v[0], stores[1].v[0])):
        assert torch.equal(quantize_kv(a.flatten(0, 1)[:n]), b.flatten(0, 1)[:n])
        assert not torch.equal(b.flatten(0, 1)[:n], torch.zeros_like(b.flatten(0, 1)[:n]))


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 2, 48), (4, 1, 12), (4, 2, 128)])
def test_attention_over_int8_rows_equals_torch_over_their_dequantized_values(heads, kv_heads, d):
    lib, g = native.load(), torch.Generator().manual_seed(3)
    n, page = 200, 16
    kc = quantize_kv(torch.randn(14, page, kv_heads, d, generator=g))
    vc = quantize_kv(torch.randn(14, page, kv_heads, d, generator=g))
    q, pages = torch.randn(n, heads, d, generator=g), torch.randperm(14, generator=g)[:13].tolist()
    m = build_batch([SeqChunk([0] * n, 0, pages)], page).meta
    out = torch.empty(n, heads, d)
    lens, cu = m.kv_lens_t.to(torch.int64).contiguous(), torch.tensor(m.cu_q, dtype=torch.int64)
    table, seqs = m.page_table.contiguous(), torch.zeros(1, dtype=torch.int64)
    lib.agrt_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), table.shape[1],
                       cu.data_ptr(), lens.data_ptr(), seqs.data_ptr(), 1, heads, kv_heads, d, page,
                       d ** -0.5, out.data_ptr(), 2, 0, 0.0)
    k = dequantize_kv(kc[pages]).flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1)
    v = dequantize_kv(vc[pages]).flatten(0, 1)[:n].repeat_interleave(heads // kv_heads, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) * d ** -0.5
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(out, torch.einsum("hqk,khd->qhd", s.softmax(-1), v), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [16, 512])
def test_engine_on_an_int8_store_matches_the_single_sequence_oracle(chunk):
    model, sp = _int8(), SamplingParams(max_tokens=12)
    prompts = _prompts(chunk + 1, 6, hi=150)
    outs, core = _run(model, prompts, sp, chunk_min=chunk, chunk_max=chunk, n_batch=chunk,
                      enable_speculation=True)
    assert outs == [generate(model, p, sp) for p in prompts]
    assert core.counters.prompt_cached > 0


def test_int8_kv_is_refused_off_the_cpu():
    from agentrt.model.loaders.load import load_model

    with pytest.raises(ConfigError, match="int8"):
        load_model("smollm2-135m", device="meta", kv_dtype="int8")


def _teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """Greedy next-token choice at every position of `ids`, prefilled in chunks of 256."""
    pages = list(range(-(-len(ids) // 16)))
    kv = KVStore.allocate(model.cfg, len(pages), 16, model.kv_dtype)
    out = []
    with torch.inference_mode():
        for s in range(0, len(ids), 256):
            part = ids[s:s + 256]
            fb = build_batch([SeqChunk(part, s, pages, want_logits=len(part))], 16)
            out.append(model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows).argmax(-1))
    return torch.cat(out)


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_int8_kv_agrees_with_float16_on_97_percent_of_teacher_forced_tokens(embedded_native):
    """A tool-calling chat (system, tools, a call, a long tool result, a question) and prose."""
    from pathlib import Path

    from agentrt.conversation.chat_format import ChatFormat

    lm = embedded_native
    tools = [{"type": "function", "function": {"name": "search_orders", "description": "Search orders.",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
    rows = "\n".join(f"order {1000 + i}: shipped to warehouse {i % 7}, status ok" for i in range(40))
    chat = ChatFormat(lm.tokenizer).encode([
        {"role": "system", "content": "You are a helpful agent. Use the tools."},
        {"role": "user", "content": "Where did order 1003 ship?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "search_orders", "arguments": {"query": "1003"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": rows},
        {"role": "user", "content": "And order 1005?"}], tools=tools)
    prose = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    ids = (chat + lm.tokenizer.encode(prose))[:2048]
    m8 = copy.copy(lm.model)
    m8.kv_dtype, m8.fused_cache = torch.int8, {}
    ref, got = _teacher_forced(lm.model, ids), _teacher_forced(m8, ids)
    agreement = (ref == got).float().mean().item()
    print(f"int8 KV teacher-forced agreement with float16: {agreement:.4f} of {len(ids)}")
    assert len(ids) == 2048 and agreement >= 0.97, agreement
