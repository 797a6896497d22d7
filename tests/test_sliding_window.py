"""Sliding-window attention against transformers: Mistral (every layer), Qwen2 (the layers its
config names) and Mixtral, with a window far smaller than the prompt, on the eager and fused
paths, from safetensors and GGUF; and the engine (chunked prefill, batches, radix hits, decode
past the window) token for token against one sequence alone.

What the window needs of the cache: every key of the last `window` positions. Agentrt keeps the
whole history in the paged KV (radix sharing, rollback, fork and snapshots stay exact, as for
full attention); queries read only their window.
"""

from __future__ import annotations

import gguf
import pytest
import torch

from agentrt.kernels import native
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.loaders.load import load_model
from agentrt.sampling import SamplingParams
from tests.test_architectures import COMMON, NEW_TOKENS, decode_logits, oracle, sharpen, write_gguf

transformers = pytest.importorskip("transformers")
needs_native = pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
WINDOW = 24  # the test prompt has 120 tokens
CASES = {
    "mistral": ("Mistral", dict(sliding_window=WINDOW, tie_word_embeddings=False), "llama"),
    "qwen2-layer1": ("Qwen2", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
                                   tie_word_embeddings=True), "qwen2"),
    "mixtral": ("Mixtral", dict(sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                                tie_word_embeddings=False), None),
}


def make(name: str):
    prefix, overrides, _ = CASES[name]
    torch.manual_seed(31 + list(CASES).index(name))
    cfg = getattr(transformers, prefix + "Config")(**COMMON, **overrides, pad_token_id=0, bos_token_id=1,
                                                  eos_token_id=2)
    hf = getattr(transformers, prefix + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith("mlp.gate.weight"):
                p.mul_(40.0)
    return sharpen(hf)


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    hf = make(name)
    hf.save_pretrained(root / "hf", safe_serialization=True)
    arch = CASES[name][2]
    if arch:
        extra = {f"{arch}.attention.sliding_window": WINDOW} if name == "mistral" else None
        write_gguf(root / "f32.gguf", hf, arch, extra_kv=extra)
        write_gguf(root / "q8.gguf", hf, arch, gguf.GGMLQuantizationType.Q8_0, extra_kv=extra)
    return name, hf, root, oracle(hf)


@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
@pytest.mark.parametrize("source", ["hf", "f32.gguf"])
def test_sliding_window_matches_transformers(case, source, path):
    name, hf, root, (prompt, want, greedy, tail) = case
    if source != "hf" and CASES[name][2] != "llama":
        pytest.skip("the GGUF case: Mistral as llama.cpp writes it (sliding_window in its metadata)")
    model = load_model(str(root / source), quantize="none", forward=path).model
    assert model.cfg.sliding_window == WINDOW
    assert [b.attn.window for b in model.blocks] == ([0, WINDOW] if name == "qwen2-layer1" else [WINDOW] * 2)
    assert (prompt_logits(model, prompt) - want).abs().max().item() < 1e-4
    assert generate(model, prompt, SamplingParams(max_tokens=NEW_TOKENS)) == greedy
    assert (decode_logits(model, prompt + greedy, path) - tail).abs().max().item() < 1e-4


@needs_native
def test_q8_0_gguf_with_a_window_on_the_native_path(case):
    """A Q8_0 GGUF kept quantized (every layer's integer GEMM, the window in the C attention):
    close to transformers through the prompt and the decoded tail."""
    name, hf, root, (prompt, want, greedy, tail) = case
    if CASES[name][2] != "llama":
        pytest.skip("the GGUF case: Mistral as llama.cpp writes it (sliding_window in its metadata)")
    model = load_model(str(root / "q8.gguf"), quantize="native").model
    assert model.blocks[0].attn.qkv.parts[0].bits == 8 and model.blocks[-1].attn.window == WINDOW
    scale, ours = want.abs().max().item(), prompt_logits(model, prompt)
    assert (ours - want).abs().max().item() < 0.03 * scale
    assert (decode_logits(model, prompt + greedy, "fused") - tail).abs().max().item() < 0.03 * scale


def test_the_window_changes_the_answer(case):
    """The oracle is not vacuous: the same weights with full attention give other logits."""
    name, hf, root, (prompt, want, _, _) = case
    model = load_model(str(root / "hf"), quantize="none").model
    for b in model.blocks:
        b.attn.window = 0
    model.fused_cache.clear()
    assert (prompt_logits(model, prompt) - want).abs().max().item() > 1e-2


@needs_native
@pytest.mark.parametrize("quantize", ["none", "int8"])
def test_engine_past_the_window_matches_one_sequence(case, quantize):
    """Chunked prefill (chunks of 16 < window), batches, a radix hit on a shared head, and decode
    continuing far past the window == generate() on each sequence alone."""
    from agentrt.config import EngineConfig
    from agentrt.engine.core import EngineCore
    from tests.engine_util import drain, submit

    name, _, root, _ = case
    model = load_model(str(root / "hf"), quantize=quantize).model
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16,
                                          response_cache_size=0))
    g = torch.Generator().manual_seed(9)
    head = torch.randint(0, 320, (50,), generator=g).tolist()
    work = [(head + torch.randint(0, 320, (n,), generator=g).tolist(), SamplingParams(max_tokens=40))
            for n in (3, 30, 61)]
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    assert core.counters.prompt_cached > 0
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp, path="eager" if quantize == "none" else None)


@needs_native
def test_session_fork_rollback_and_snapshot_past_the_window(case):
    """The operations that need history beyond the window (a rollback to before it, a fork
    that continues from a point, a snapshot restored elsewhere) stay exact: the KV keeps every
    position. Each continuation equals generate() on its own token history."""
    from agentrt.config import EngineConfig
    from agentrt.engine.core import EngineCore
    from tests.engine_util import drain, submit

    _, _, root, _ = case
    model = load_model(str(root / "hf"), quantize="int8").model
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, response_cache_size=0))
    g = torch.Generator().manual_seed(13)
    hist = torch.randint(0, 320, (90,), generator=g).tolist()  # almost 4 windows
    sp = SamplingParams(max_tokens=12)
    es = core.open_session(core.pool.acquire("session", 0), tag="main")
    r = submit(core, hist, sp, session=es)
    drain(core)
    assert r.output == generate(model, hist, sp)
    fork = core.branching.fork(es, core.pool.acquire("session", 0), tag="fork")
    data = core.branching.export(es)
    core.branching.rollback(es, 10)  # back to before the window of every later position
    more = torch.randint(0, 320, (30,), generator=g).tolist()
    for session, prompt in ((es, hist[:10] + more), (fork, hist + r.output[:-1] + more)):
        q = submit(core, prompt, sp, session=session)
        drain(core)
        assert q.output == generate(model, prompt, sp)
    restored = core.branching.restore(core.pool.acquire("session", 0), data, tag="restored", cache_salt=None)
    q = submit(core, hist + r.output[:-1] + more[:5], sp, session=restored)
    drain(core)
    assert q.output == generate(model, hist + r.output[:-1] + more[:5], sp)
    for s in (es, fork, restored):
        core.close_session(s)
    core.check_invariants()
