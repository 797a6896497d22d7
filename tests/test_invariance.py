"""Same prompt, same tokens on the default path: quantized weights, float16 KV, fused kernels.

A sequence's logits must not depend on how the work was cut (model/fused.py, batch invariance).
Oracles: bitwise-equal logits rows for the kernels and the forward (a row computed alone, in a
longer chunk, after a cached prefix, beside unrelated sequences), and greedy tokens equal to
`generate()` -- one sequence, unchunked, a cold private KV store, on the same model and path --
across session reuse, radix hits, tier demote/promote, snapshot/restore, fork, chunk sizes,
batches with unrelated requests and speculation, for the tiny quantized models and the embedded
SmolLM2. A property test draws prompt sets, orders and chunk sizes."""

from __future__ import annotations

import random

import anyio
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.engine import Engine
from agentrt.kernels import native
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_native
from tests.engine_util import drain, submit

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels are not built")

V = 301
BASE = dict(response_cache_size=0, debug_invariants=True)


def _prompts(seed: int, n: int, shared: int = 40, lo: int = 1, hi: int = 90) -> list[list[int]]:
    """n prompts, every other one starting with the same `shared` tokens (radix hits)."""
    rng = random.Random(seed)
    head = [rng.randrange(1, V) for _ in range(shared)]
    return [(head if i % 2 == 0 else []) + [rng.randrange(1, V) for _ in range(rng.randrange(lo, hi))]
            for i in range(n)]


def _run(model, prompts, sp, **cfg) -> tuple[list[list[int]], EngineCore]:
    """Every prompt submitted at once to one engine; their outputs."""
    core = EngineCore(model, EngineConfig(**{**BASE, **cfg}))
    reqs = [submit(core, p, sp) for p in prompts]
    drain(core)
    return [r.output for r in reqs], core


# ---- the forward: logits rows bitwise equal however the rows were cut ----------------------

def _logits(model, chunks: list[tuple[list[int], int, list[int]]], kv) -> torch.Tensor:
    fb = build_batch([SeqChunk(t, start, pages, want_logits=len(t)) for t, start, pages in chunks], 16)
    return model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_rows_logits_are_bitwise_the_same_alone_chunked_cached_and_batched(arch):
    model = tiny_native(arch)
    rng = random.Random(1)
    prompt = [rng.randrange(V) for _ in range(70)]
    other = [rng.randrange(V) for _ in range(45)]
    kv = KVStore.allocate(model.cfg, 16, 16, model.kv_dtype)
    a, b = list(range(5)), list(range(5, 10))  # the prompt's pages; the other sequence's
    whole = _logits(model, [(prompt, 0, a)], kv)
    for cut in (1, 17, 33, 69):  # a cached prefix, then the rest as one chunk beside another sequence
        _logits(model, [(prompt[:cut], 0, a)], kv)
        rest = _logits(model, [(other, 0, b), (prompt[cut:], cut, a)], kv)[len(other):]
        assert torch.equal(rest, whole[cut:]), cut
    for i in range(len(prompt)):  # one token at a time: decode steps
        row = _logits(model, [(prompt[i:i + 1], i, a)], kv)
        assert torch.equal(row[0], whole[i]), i


@pytest.mark.parametrize("n,window", [(75, 0), (75, 5), (75, 21), (75, 32), (600, 0), (600, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(6, 2, 16), (4, 4, 64), (8, 2, 64), (4, 2, 128), (3, 1, 48),
                                              (4, 2, 12), (4, 1, 256)])
def test_attention_kernel_rows_do_not_depend_on_the_chunk(dtype, heads, kv_heads, d, n, window):
    """Full causal attention and sliding windows (a query sees its last `window` keys) against
    torch, and each row the same bits whatever chunk it is computed in: short chunks run their
    key segments as separate tasks, long ones fold them in one (600 keys: three segments)."""
    lib, g = native.load(), torch.Generator().manual_seed(0)
    page = 8
    total = (n + page - 1) // page + 2
    kc = torch.randn(total, page, kv_heads, d, generator=g).to(dtype)
    vc = torch.randn(total, page, kv_heads, d, generator=g).to(dtype)
    q = torch.randn(n, heads, d, generator=g)
    pages = torch.randperm(total, generator=g)[:total - 2].tolist()

    def attend(start: int, rows: int) -> torch.Tensor:
        m = build_batch([SeqChunk([0] * rows, start, pages)], page).meta
        out, qq = torch.empty(rows, heads, d), q[start:start + rows].contiguous()
        table, cu = m.page_table.contiguous(), torch.tensor(m.cu_q, dtype=torch.int64)
        lens, seqs = m.kv_lens_t.to(torch.int64).contiguous(), torch.tensor([0], dtype=torch.int64)
        lib.agrt_attention(qq.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), table.shape[1],
                           cu.data_ptr(), lens.data_ptr(), seqs.data_ptr(), 1, heads, kv_heads, d, page,
                           d ** -0.5, out.data_ptr(), int(dtype == torch.float16), window, 0.0)
        return out

    whole = attend(0, n)
    k = kc.float()[pages].flatten(0, 1).repeat_interleave(heads // kv_heads, 1)  # [n, H, D]
    v = vc.float()[pages].flatten(0, 1).repeat_interleave(heads // kv_heads, 1)
    s = torch.einsum("qhd,khd->hqk", q, k[:n]) * d ** -0.5
    hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
    if window:
        hidden |= torch.ones(n, n, dtype=torch.bool).tril(-window)
    s = s.masked_fill(hidden, float("-inf"))
    ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[:n])
    torch.testing.assert_close(whole, ref, atol=2e-5, rtol=1e-4)
    for start, rows in ((0, 1), (5, 1), (16, 17), (40, 35), (74, 1), (n - 16, 16), (n - 40, 40), (n - 1, 1)):
        assert torch.equal(attend(start, rows), whole[start:start + rows]), (start, rows)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int8])
@pytest.mark.parametrize("window", [0, 700])
def test_decode_rows_sharing_a_prefixs_pages_keep_their_own_bits(dtype, window):
    """Decode rows of sequences whose tables share whole key segments (a prefix the radix cache
    shares) read those segments once in one task (cascade attention): each row's output is the
    bits it has alone, and torch's within tolerance. Sequences: a shared 600-key prefix (two
    whole segments of 256 and a part) + tails of their own; one row that only shares a part."""
    from agentrt.kernels.reference import dequantize_kv, quantize_kv

    lib, g = native.load(), torch.Generator().manual_seed(5)
    heads, kv_heads, d, page = 6, 2, 64, 16
    enc = (lambda x: quantize_kv(x)) if dtype == torch.int8 else (lambda x: x.to(dtype))
    kc = enc(torch.randn(160, page, kv_heads, d, generator=g))
    vc = enc(torch.randn(160, page, kv_heads, d, generator=g))
    shared = list(range(37))  # 592 keys' pages
    tables = [shared + list(range(40 + 20 * i, 60 + 20 * i)) for i in range(4)] + [list(range(100, 160))]
    lens = [700, 820, 611, 905, 300]
    q = torch.randn(len(lens), heads, d, generator=g)

    def attend(rows: list[int]) -> torch.Tensor:
        fb = build_batch([SeqChunk([0], lens[i] - 1, tables[i]) for i in rows], page)
        m, out = fb.meta, torch.empty(len(rows), heads, d)
        qq, table, cu = q[rows].contiguous(), m.page_table.contiguous(), torch.tensor(m.cu_q, dtype=torch.int64)
        kvl, seqs = m.kv_lens_t.to(torch.int64).contiguous(), torch.arange(len(rows), dtype=torch.int64)
        mode = {torch.float16: 1, torch.int8: 2}[dtype]
        lib.agrt_attention(qq.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), table.shape[1],
                           cu.data_ptr(), kvl.data_ptr(), seqs.data_ptr(), len(rows), heads, kv_heads, d, page,
                           d ** -0.5, out.data_ptr(), mode, window, 0.0)
        return out

    together = attend(list(range(len(lens))))
    dec = dequantize_kv if dtype == torch.int8 else (lambda x: x.float())
    for i in range(len(lens)):
        assert torch.equal(attend([i]), together[i:i + 1]), i
        k = dec(kc[tables[i]]).flatten(0, 1)[:lens[i]].repeat_interleave(heads // kv_heads, 1)
        v = dec(vc[tables[i]]).flatten(0, 1)[:lens[i]].repeat_interleave(heads // kv_heads, 1)
        k, v = (k[-window:], v[-window:]) if window else (k, v)
        ref = torch.einsum("hk,khd->hd", (torch.einsum("hd,khd->hk", q[i], k) * d ** -0.5).softmax(-1), v)
        torch.testing.assert_close(together[i], ref, atol=2e-5, rtol=1e-4)


# ---- the engine: greedy tokens equal the cold single-sequence oracle -----------------------

@pytest.mark.parametrize("chunk", [16, 64, 512])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_chunked_batched_and_radix_cached_prompts_match_the_oracle(chunk, arch):
    model, sp = tiny_native(arch), SamplingParams(max_tokens=12)
    prompts = _prompts(chunk, 8, hi=160)
    outs, core = _run(model, prompts, sp, chunk_min=chunk, chunk_max=chunk, n_batch=chunk)
    assert outs == [generate(model, p, sp) for p in prompts]
    assert core.counters.prompt_cached > 0  # radix hits on the shared head


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("spec", [False, True])
def test_a_prompt_beside_unrelated_requests_with_or_without_speculation(batch, spec):
    model, sp = tiny_native("llama"), SamplingParams(max_tokens=24)
    prompts = _prompts(batch, batch, shared=0)
    outs, core = _run(model, prompts, sp, enable_speculation=spec)
    assert outs == [generate(model, p, sp) for p in prompts]
    assert (core.counters.spec_accepted > 0) == spec  # the tiny llama repeats itself: drafts land


def test_session_turns_and_tier_demote_promote_match_the_oracle():
    """Two agents alternating over a pool that holds about one history: each turn reuses the
    session or promotes its demoted pages back from the tier, and equals a cold run."""
    model, sp = tiny_native("qwen2"), SamplingParams(max_tokens=4)
    core = EngineCore(model, EngineConfig(kv_cache_tokens=12 * 16, enable_speculation=False, **BASE))
    rng = random.Random(5)
    hist = {t: [rng.randrange(V) for _ in range(64)] for t in "ab"}
    sess = {t: core.open_session(core.pool.acquire("session", 0), tag=t) for t in "ab"}
    for turn in range(4):
        for t in "ab":
            hist[t] += [rng.randrange(V) for _ in range(16)]
            core.idle()
            r = submit(core, hist[t], sp, session=sess[t])
            drain(core)
            assert r.output == generate(model, hist[t], sp), (turn, t)
            hist[t] += r.output
    assert core.counters.promoted_pages > 0 and core.counters.prompt_cached > 0


def test_snapshot_restore_and_fork_continue_as_a_cold_run(tmp_path):
    model, sp = tiny_native("qwen2"), SamplingParams(max_tokens=8)
    first = _prompts(7, 1, shared=0, lo=50)[0]

    async def main():
        async with Engine(model, EngineConfig(**BASE)) as eng:
            s = await eng.open_session(tag="a")
            c = await eng.complete(first, sp, session=s)
            path = await s.snapshot(tmp_path / "a.snap")
            child = await s.fork()
            full = first + c.token_ids + [5, 6, 7]
            for sess in (s, child):
                assert (await eng.complete(full + [1 + (sess is s)], sp, session=sess)).token_ids == \
                    generate(model, full + [1 + (sess is s)], sp)
            await child.close()
            await s.close()
        async with Engine(model, EngineConfig(**BASE, page_size=8)) as eng:
            r = await eng.restore(path)
            assert (await eng.complete(full, sp, session=r)).token_ids == generate(model, full, sp)
            await r.close()
    anyio.run(main)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), chunk=st.sampled_from([16, 32, 100, 4096]),
       spec=st.booleans(), arch=st.sampled_from(["llama", "qwen2"]))
def test_property_any_prompt_set_order_and_chunking_matches_the_oracle(seed, n, chunk, spec, arch):
    model, sp = tiny_native(arch), SamplingParams(max_tokens=6)
    prompts = _prompts(seed, n, shared=random.Random(seed).choice([0, 20, 48]), hi=120)
    random.Random(seed + 1).shuffle(prompts)
    outs, _ = _run(model, prompts, sp, chunk_min=chunk, chunk_max=chunk, n_batch=chunk, enable_speculation=spec)
    assert outs == [generate(model, p, sp) for p in prompts]


# ---- the embedded SmolLM2 (Q4_1 weights, float16 KV): the case that broke make test --------

SYSTEM = ("You are a helpful assistant that answers questions about weather, cities and travel. "
          "Answer carefully and briefly, with facts.")
QUESTIONS = ("What is the weather usually like in Paris in spring, and what should I pack?",
             "Tell me about Rome.", "List three museums in London and one fact about each.",
             "Which is larger, Lyon or Marseille? Answer in one sentence.")


def _chat(tok, q: str) -> list[int]:
    return tok.encode(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
                      "<|im_start|>assistant\n")


@pytest.mark.embedded
@pytest.mark.parametrize("case", ["radix", "session", "chunk16", "chunk64", "batch8", "speculation"])
def test_embedded_output_does_not_depend_on_what_the_cache_held(embedded_native, case):
    model, tok = embedded_native.model, embedded_native.tokenizer
    sp = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = [_chat(tok, q) for q in QUESTIONS]
    want = [generate(model, p, sp) for p in prompts]
    cfg = dict(enable_speculation=case == "speculation")
    if case.startswith("chunk"):
        c = int(case[5:])
        cfg.update(chunk_min=c, chunk_max=c, n_batch=c)
    if case == "batch8":
        outs, _ = _run(model, prompts + prompts[::-1], sp, **cfg)
        assert outs == want + want[::-1]
        return
    core = EngineCore(model, EngineConfig(**{**BASE, **cfg}))
    if case == "session":  # one conversation: each turn reuses the KV of the turns before
        s, hist = core.open_session(core.pool.acquire("session", 0)), []
        for q in QUESTIONS:
            turn = f"<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
            hist = hist + tok.encode(turn) if hist else _chat(tok, q)
            r = submit(core, hist, sp, session=s)
            drain(core)
            assert r.output == generate(model, hist, sp)
            hist = hist + r.output
    for p, w in zip(prompts, want):  # one after another: each finds the shared head cached
        r = submit(core, p, sp)
        drain(core)
        assert r.output == w
    assert core.counters.prompt_cached > 0
    if case == "speculation":
        assert core.counters.spec_proposed > 0


def test_batch_invariant_switch_is_checked_and_reaches_the_model():
    from agentrt.errors import ConfigError
    from agentrt.model.loaders.load import load_model

    with pytest.raises(ConfigError, match="batch_invariant must be True or False"):
        load_model("smollm2-135m", batch_invariant="yes")
    assert tiny_native("llama").batch_invariant is True  # the default of every model
