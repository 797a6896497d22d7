"""The fused forward (compiled CPU kernels) against the eager torch reference: same logits to
float rounding, token-identical greedy output through every engine path (batching, chunked
prefill, sessions, speculation); quantized weights against fp32 on the embedded model."""

from __future__ import annotations

import random

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.quant import quantize
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import drain, submit

pytestmark = pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
V = 301


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_logits_match_eager(arch):
    model = tiny_model(arch)
    ids = list(range(3, 200, 2))
    a, b = prompt_logits(model, ids, path="fused"), prompt_logits(model, ids, path="eager")
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ConfigError):
        prompt_logits(model, ids, path="compiled")


def _workload(seed: int, n: int):
    rng = random.Random(seed)
    shared = [rng.randrange(V) for _ in range(40)]
    names = [[rng.randrange(V) for _ in range(4)] for _ in range(3)]
    out = []
    for i in range(n):
        body = [rng.randrange(V) for _ in range(rng.randrange(1, 120))]
        for _ in range(rng.randrange(0, 5)):  # repeats give prompt-lookup drafts
            body += rng.choice(names)
        out.append(((shared if i % 3 == 0 else []) + body, SamplingParams(max_tokens=rng.randrange(1, 24))))
    return out


@pytest.mark.parametrize("chunk", [1, 128])
@pytest.mark.parametrize("quant", ["none", "int8"])
def test_engine_on_fused_path_matches_naive_reference(chunk, quant):
    """Batch of 24, chunked prefill and speculation on the fused path == one sequence at a
    time (fp32: on the eager path; int8: the same quantized model, the kernel being
    batch-invariant)."""
    model = quantize(tiny_model("llama"), quant)
    cfg = EngineConfig(kv_cache_tokens=16384, chunk_min=chunk, chunk_max=chunk, n_batch=chunk,
                       spec_token_budget=200, spec_min_acceptance=0.0, response_cache_size=0)
    core = EngineCore(model, cfg)
    work = _workload(chunk, 24)
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    oracle = "eager" if quant == "none" else "fused"
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp, path=oracle), r.rid
    assert core.stats().spec_proposed > 0


def test_sessions_on_fused_path_match_eager_reference():
    model = tiny_model("qwen2")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096))
    rng = random.Random(5)
    hist = {a: [rng.randrange(V) for _ in range(30)] for a in range(4)}
    sessions = {a: core.open_session(core.pool.acquire("session", 0), tag=f"a{a}") for a in hist}
    for _turn in range(4):
        for a in hist:
            hist[a] += [rng.randrange(V) for _ in range(rng.randrange(2, 20))]
            sp = SamplingParams(max_tokens=rng.randrange(2, 10))
            r = submit(core, hist[a], sp, session=sessions[a])
            drain(core)
            assert r.output == generate(model, hist[a], sp, path="eager")
            hist[a] += r.output
    for s in sessions.values():
        core.close_session(s)
    core.check_invariants()


def test_engine_config_selects_the_eager_path():
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=2048, forward_path="eager"))
    r = submit(core, list(range(5, 60)), SamplingParams(max_tokens=8))
    drain(core)
    assert r.output == generate(model, list(range(5, 60)), SamplingParams(max_tokens=8), path="eager")
    with pytest.raises(ConfigError):
        EngineConfig(forward_path="jit")


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_fused_fp32_is_token_identical_to_eager(embedded):
    tok = embedded.tokenizer
    prompts = [tok.encode(t) for t in ("The capital of France is", "def fibonacci(n):",
                                       "List three colors: red,")]
    params = SamplingParams(max_tokens=24)
    core = EngineCore(embedded.model, EngineConfig(response_cache_size=0))
    reqs = [submit(core, p, params) for p in prompts * 3]  # batch of 9 with speculation
    drain(core)
    for r, p in zip(reqs, prompts * 3):
        assert r.output == generate(embedded.model, p, params, path="eager")


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_native_quantization_agrees_with_fp32(embedded, embedded_native):
    """Teacher-forced: fp32's greedy continuation is fed to both; the native (Q4_1/Q8_0)
    model's argmax agrees with fp32's at >= 97% of positions."""
    tok = embedded.tokenizer
    agree, total = 0, 0
    for text in ("The capital of France is", "Write a Python function that adds two numbers.",
                 "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"):
        ids = tok.encode(text)
        full = ids + generate(embedded.model, ids, SamplingParams(max_tokens=64))
        a = prompt_logits(embedded.model, full)[len(ids) - 1:]
        b = prompt_logits(embedded_native.model, full)[len(ids) - 1:]
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
    assert agree / total >= 0.97, agree / total


def test_fused_path_rejects_out_of_range_batches():
    """The kernels index raw memory: a position past the rope table or a slot past the KV store
    is a typed error, as the eager path's indexing would raise, never a stray write."""
    from agentrt.kv.store import KVStore
    from agentrt.model.batch import SeqChunk, build_batch

    model = tiny_model("llama")
    kv = KVStore.allocate(model.cfg, 2, 16)
    ok = build_batch([SeqChunk([5, 6], 0, [0, 1])], 16)
    model(ok.input_ids, ok.positions, kv, ok.meta, ok.logits_rows, path="fused")
    for bad in (build_batch([SeqChunk([5], 40, [0, 1, 2])], 16),  # page 2 of a 2-page store
                build_batch([SeqChunk([5], model.cfg.max_position_embeddings, [0] * 200)], 16)):
        with pytest.raises(ConfigError):
            model(bad.input_ids, bad.positions, kv, bad.meta, bad.logits_rows, path="fused")


@pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
def test_native_argmax_equals_torch_argmax():
    """The compiled argmax: first of tied maxima, the first NaN of a row that has one, any width
    (vector body and scalar tail), a strided row view; the same ids as torch.argmax."""
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(8, 49152, generator=g), torch.randn(3, 17, generator=g), torch.randn(5, 1, generator=g)]
    x = torch.randn(5, 100, generator=g)
    x[1, 7] = x[1, 50] = float("nan")
    x[2, 3] = float("inf")
    x[3] = 5.0  # all tied
    x[4, 20] = x[4, 90] = 1e9  # tied maxima
    cases += [x, torch.randn(4, 64, generator=g)[:, :40], torch.full((2, 33), -float("inf"))]
    for c in cases:
        assert torch.equal(native.argmax(c), torch.argmax(c, dim=-1)), c.shape
