"""Sliding-window layers' pages released as sequences slide past them (agentrt/kv/window.py).

Models: Mistral (every layer slides), Qwen2 with one full-attention layer beside a sliding one,
and Gemma 3 (five local layers, one global, two RoPE tables), all tiny with a window of 24 under
prompts of 50-300 tokens. The oracle is generate() on each token history alone: the engine,
releasing pages under batches, chunked prefill, radix hits, sessions growing turn by turn,
rollback to before the window, fork, snapshots and the KV tier, must give the same tokens.
Every step checks the allocator's invariants, the local pool's among them (a local page is free
xor mapped from one live logical page), and the local pages a session keeps stay within its
window however long its history grows.
"""

from __future__ import annotations

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.errors import ConfigError, SnapshotMismatch
from agentrt.kernels import native
from agentrt.kv.window import split_pool, window_start
from agentrt.model.generate import generate
from agentrt.model.loaders.load import load_model
from agentrt.sampling import SamplingParams
from tests.engine_util import drain, submit

transformers = pytest.importorskip("transformers")
WINDOW, PS = 24, 16
MODELS = ["mistral", "qwen2-layer1", "gemma3"]


def _hf(name: str):
    if name == "gemma3":
        from tests.test_gemma import make
    else:
        from tests.test_sliding_window import make
    return make(name)


@pytest.fixture(scope="module", params=[(m, p) for m in MODELS for p in ("fused", "eager")], ids=str)
def model(request, tmp_path_factory):
    """The kernels' all-layers and layer-by-layer calls on int8 weights, or the torch reference."""
    name, path = request.param
    if path == "fused" and not native.available():
        pytest.skip("compiled CPU kernels not built")
    root = tmp_path_factory.mktemp(name)
    _hf(name).save_pretrained(root / "hf", safe_serialization=True)
    quantize = "int8" if path == "fused" else "none"
    return load_model(str(root / "hf"), quantize=quantize, forward=path).model


def engine(model, **kw) -> EngineCore:
    cfg = dict(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16, window_kv_tokens=320,
               response_cache_size=0, debug_invariants=True)
    return EngineCore(model, EngineConfig(**{**cfg, **kw}))


def present(core, seq) -> int:
    return sum(core.alloc.local.present(p) for p in seq.pages)


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_pool_splits_and_gains_history(model):
    core = engine(model)
    local = core.alloc.local
    assert local is not None and local.num_local == 320 // PS
    assert core.cfg.num_pages > 4096 // PS  # (the bytes the windows free hold more history)
    store = core.kvm.store
    assert [t.shape[0] for t in store.k] == [local.num_local if loc else core.cfg.num_pages
                                            for loc in store.local_layers]


def test_batches_release_pages_and_match_one_sequence(model):
    """Three requests sharing a 50-token head, chunked prefill of 16 < window, decoding past it."""
    core = engine(model)
    head = tokens(1, 50)
    work = [head + tokens(2 + n, n) for n in (3, 30, 61)]
    sp = SamplingParams(max_tokens=40)
    reqs = [submit(core, p, sp) for p in work]
    drain(core)
    st = core.stats()
    assert st.window_pages_released > 0 and st.window_pages_total == 320 // PS
    for r, p in zip(reqs, work):
        assert r.output == generate(model, p, sp)
    again = submit(core, work[2] + tokens(9, 5), sp)  # (a radix hit on a released head: cut back)
    drain(core)
    assert again.output == generate(model, work[2] + tokens(9, 5), sp)


def test_a_session_keeps_its_window_only(model):
    """Turn after turn the history grows to ~225 tokens; the local pages it holds stay ~window."""
    core = engine(model)
    es = core.open_session(core.pool.acquire("session", 0), tag="agent")
    hist, sp = [], SamplingParams(max_tokens=20)
    bound = -(-(WINDOW + 2 * PS) // PS) + 1
    for turn in range(5):
        hist = hist + tokens(20 + turn, 25)
        r = submit(core, hist, sp, session=es)
        while core.has_work():
            core.step()
            for q in core.running:
                assert present(core, q.seq) <= bound + 1, "a running sequence holds pages past its window"
        assert r.output == generate(model, hist, sp)
        hist = hist + r.output
        assert present(core, es.seq) <= bound, (turn, present(core, es.seq))
        first = window_start(len(es.seq.tokens), WINDOW) // PS
        assert all(core.alloc.local.present(p) for p in es.seq.pages[first:])
    assert len(es.seq.pages) > 2 * bound
    core.close_session(es)
    core.check_invariants()


def test_rollback_fork_and_snapshot_across_released_pages(model):
    """Rolling back to before the window cuts back to a point with its window (recomputing the
    rest); a fork and a restored snapshot go on from the end as their source would."""
    core = engine(model)
    hist, sp = tokens(30, 130), SamplingParams(max_tokens=12)
    es = core.open_session(core.pool.acquire("session", 0), tag="main")
    r = submit(core, hist, sp, session=es)
    drain(core)
    full = hist + r.output[:-1]
    assert not core.alloc.local.present(es.seq.pages[0])
    fork = core.branching.fork(es, core.pool.acquire("session", 0), tag="fork")
    data = core.branching.export(es)
    assert bool(data["local_absent"][0]) and not bool(data["local_absent"][-1])
    core.branching.rollback(es, 60)
    more = tokens(31, 20)
    for session, prompt in ((es, full[:len(full) - 60] + more), (fork, full + more)):
        q = submit(core, prompt, sp, session=session)
        drain(core)
        assert q.output == generate(model, prompt, sp)
    restored = core.branching.restore(core.pool.acquire("session", 0), data, tag="restored", cache_salt=None)
    assert not core.alloc.local.present(restored.seq.pages[0])
    q = submit(core, full + more[:5], sp, session=restored)
    drain(core)
    assert q.output == generate(model, full + more[:5], sp)
    for s in (es, fork, restored):
        core.close_session(s)
    core.check_invariants()
    one_pool = engine(model, window_kv_tokens=0, kv_cache_tokens=256)  # (it cannot tell them apart)
    assert one_pool.alloc.local is None
    with pytest.raises(SnapshotMismatch, match="released"):
        one_pool.branching.restore(one_pool.pool.acquire("session", 0), data, tag="x", cache_salt=None)
    one_pool.check_invariants()


def test_the_tier_keeps_which_pages_were_released(model):
    """A node demoted with released pages comes back with them released; a match through it
    stops where the window is whole, and the answer is exact."""
    core = engine(model, kv_tier_bytes=64 << 20)
    prompt, sp = tokens(40, 120), SamplingParams(max_tokens=8)
    r = submit(core, prompt, sp)
    drain(core)
    radix, local, demoted_absent = core.radix, core.alloc.local, 0
    for leaf in list(radix.resident_leaves()):
        absent = [i for i, p in enumerate(leaf.pages) if not local.present(p)]
        radix.discard(leaf)
        assert leaf.host is not None and list(leaf.host.absent) == absent
        demoted_absent += len(absent)
    assert demoted_absent > 0
    core.check_invariants()
    prompt2 = prompt + r.output[:-1] + tokens(41, 9)
    q = submit(core, prompt2, sp)
    drain(core)
    assert q.output == generate(model, prompt2, sp)


def test_split_pool_rules(model):
    cfg = EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16)
    big, local = split_pool(cfg, model.cfg)
    assert local == (16 + 8 * (WINDOW + 2 * PS)) // PS and big.kv_cache_tokens > 4096
    assert split_pool(EngineConfig(kv_cache_tokens=256), model.cfg) == (EngineConfig(kv_cache_tokens=256), None)
    with pytest.raises(ConfigError, match="window_kv_tokens"):
        split_pool(EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16, window_kv_tokens=32), model.cfg)
