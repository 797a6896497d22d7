"""Batched, cached, chunked, preempted engine output == naive one-sequence greedy, token for
token, with every cache invariant checked after every step."""

from __future__ import annotations

import random

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from agentrt.scheduling.preemption import preempt
from tests.conftest import tiny_model
from tests.engine_util import drain, submit

V = 301


def _concurrent_prompts(seed: int, n: int = 32):
    rng = random.Random(seed)
    shared = [rng.randrange(V) for _ in range(40)]
    out = []
    for i in range(n):
        body = [rng.randrange(V) for _ in range(rng.randrange(1, 150))]
        out.append(((shared if i % 3 == 0 else []) + body, SamplingParams(max_tokens=rng.randrange(1, 24))))
    return out


@pytest.mark.parametrize("radix", [True, False])
@pytest.mark.parametrize("chunk", [1, 128, 4096])
def test_32_concurrent_requests_match_naive(radix, chunk):
    model = tiny_model("llama")
    cfg = EngineConfig(kv_cache_tokens=16384, enable_radix_cache=radix, chunk_min=chunk,
                       chunk_max=chunk, n_batch=chunk)
    core = EngineCore(model, cfg)
    work = _concurrent_prompts(seed=chunk)
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp), r.rid


def test_tiny_pool_evicts_and_preempts_without_changing_output():
    model = tiny_model("qwen2")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=640, page_size=16))
    work = _concurrent_prompts(seed=7, n=24)
    reqs = [submit(core, p, sp) for p, sp in work]
    for _ in range(6):  # admission by footprint avoids preemption; force some mid-run
        core.step()
        if core.running:
            preempt(core.mem, core.scheduler.queues, max(core.running, key=lambda r: r.admitted_at))
    drain(core)
    st = core.stats()
    assert st.preemptions > 0 and st.evicted_pages > 0
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp)


def _run_sessions(core, model, n_agents, n_turns, seed, edit_turn=None):
    """Interleaved agents A1 B1 C1 A2 ...: each turn appends a message and asks the session.
    Returns per-turn (prompt, cached, computed) for the counters test."""
    rng = random.Random(seed)
    system = [rng.randrange(V) for _ in range(37)]
    hist = {a: list(system) for a in range(n_agents)}
    turns = {a: [] for a in range(n_agents)}  # history length before each turn
    sessions = {a: core.open_session(core.pool.acquire("session", 0), tag=f"agent{a}") for a in range(n_agents)}
    record = []
    for t in range(n_turns):
        for a in range(n_agents):
            if edit_turn is not None and t == edit_turn:
                hist[a] = hist[a][:turns[a][3]] + [rng.randrange(V) for _ in range(9)]
            turns[a].append(len(hist[a]))
            hist[a] += [rng.randrange(V) for _ in range(rng.randrange(3, 25))]
            sp = SamplingParams(max_tokens=rng.randrange(2, 12))
            held = list(sessions[a].seq.tokens)
            r = submit(core, hist[a], sp, session=sessions[a])
            drain(core)
            assert r.output == generate(model, hist[a], sp), (a, t)
            record.append((held, list(hist[a]), r.usage()))
            hist[a] += r.output
    for s in sessions.values():
        core.close_session(s)
        core.check_invariants()
    return record


@pytest.mark.parametrize("radix", [True, False])
def test_sessions_interleaved_compute_only_their_delta(radix):
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, enable_radix_cache=radix))
    for held, prompt, usage in _run_sessions(core, model, 8, 10, seed=3):
        lcp = 0
        while lcp < min(len(held), len(prompt)) and held[lcp] == prompt[lcp]:
            lcp += 1
        if held:  # a turn after the first: exactly the new tokens are prefilled
            assert lcp == len(held)
            assert usage.cached_tokens == len(held)
            assert usage.computed_prompt_tokens == len(prompt) - len(held)


def test_edited_history_rolls_back_to_common_prefix():
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=16384))
    record = _run_sessions(core, model, 2, 7, seed=11, edit_turn=5)
    edited = [u for held, p, u in record if held and p[: len(held)] != held]
    assert edited, "the edit must make the prompt diverge from the session"
    for u in edited:
        assert u.computed_prompt_tokens == u.prompt_tokens - u.cached_tokens


def test_sessions_under_memory_pressure_are_detached_not_deadlocked():
    model = tiny_model("qwen2")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=480, page_size=16, max_session_seqs=8))
    _run_sessions(core, model, 6, 5, seed=5)
    assert core.stats().detached_sessions > 0


def test_prefix_grouped_prefill_computes_the_shared_block_once():
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=16384, enable_radix_cache=False))
    rng = random.Random(2)
    shared = [rng.randrange(V) for _ in range(200)]
    work = [(shared + [rng.randrange(V) for _ in range(10)], SamplingParams(max_tokens=4)) for _ in range(6)]
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    assert core.stats().prompt_computed <= 200 + 6 * 10 + 6
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp)


def test_requests_that_cannot_fit_together_wait_instead_of_livelocking():
    """Three long requests that each fit alone but not two together: the engine makes progress,
    a request that cannot run now waits for room (admitted again only alone) instead of
    failing, each is preempted at most once, every one finishes with naive decoding's tokens,
    and one that can never fit is refused at once."""
    from agentrt.errors import OutOfKVMemory

    model = tiny_model()
    core = EngineCore(model, EngineConfig(kv_cache_tokens=256, page_size=16, response_cache_size=0))
    rng = random.Random(7)
    events, reqs, work = [], [], []
    for _ in range(3):
        prompt = [rng.randrange(301) for _ in range(150)]
        sp = SamplingParams(max_tokens=80, ignore_eos=True)
        work.append((prompt, sp))
        seq_id = core.pool.acquire("transient", 0)
        reqs.append(core.add_request(prompt, sp, events.append, seq_id=seq_id))
    drain(core, max_steps=20_000)
    assert [r.finish_reason for r in reqs] == ["length"] * 3
    assert all(r.preemptions <= 1 for r in reqs)  # (held back by the footprint check, or preempted once)
    for r, (prompt, sp) in zip(reqs, work):
        assert r.output == generate(model, prompt, sp)
    core.check_invariants()
    with pytest.raises(OutOfKVMemory, match="high-water"):
        core.add_request([1] * 240, SamplingParams(max_tokens=8), events.append,
                         seq_id=core.pool.acquire("transient", 0))


@pytest.mark.parametrize("radix", [True, False])
def test_sessions_of_equal_length_with_different_histories_are_never_grouped(radix):
    """Two sessions hold different histories of the same length; their next turns, admitted in
    one step, begin with the same 20 tokens. Prefix grouping must not make one alias the other's
    KV (it once keyed candidates on the match point and the next tokens only): each reply equals
    naive decoding of its own history, and no page is listed under two token runs."""
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, enable_radix_cache=radix, prefix_group_k=8))
    rng = random.Random(5)
    hists = [[rng.randrange(V) for _ in range(40)] for _ in range(2)]
    sessions = [core.open_session(core.pool.acquire("session", 0), tag=f"s{i}") for i in range(2)]
    for h, s in zip(hists, sessions):  # first turns, one at a time: each session holds its 40 tokens
        submit(core, h, SamplingParams(max_tokens=1), session=s)
        drain(core)
        assert s.seq.num_cached == 40
    common = [rng.randrange(V) for _ in range(20)]
    sp = SamplingParams(max_tokens=6)
    reqs = [submit(core, h + common, sp, session=s) for h, s in zip(hists, sessions)]
    drain(core)
    for r, h in zip(reqs, hists):
        assert r.output == generate(model, h + common, sp)
    assert core.counters.grouped_tokens == 0


def test_a_batch_moves_every_tensor_to_the_models_device():
    """ModelExecutor builds batches on the host and moves them to the model's device (a GPU's):
    every tensor of the batch and of its metadata, the sliding-window part included, goes."""
    import dataclasses

    from agentrt.model.batch import SeqChunk, build_batch

    local_of = torch.arange(8, dtype=torch.int64)
    fb = build_batch([SeqChunk([1, 2, 3], 0, [0]), SeqChunk([4], 5, [1, 2])], 4, local_of)
    assert fb.to("cpu") is fb
    moved = fb.to("meta")

    def tensors(obj):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if isinstance(v, torch.Tensor):
                yield f.name, v
            elif dataclasses.is_dataclass(v):
                yield from tensors(v)
    names = [n for n, _ in tensors(fb)]
    assert len(names) >= 9 and all(t.device.type == "meta" for _, t in tensors(moved)), names
    assert [t.shape for _, t in tensors(moved)] == [t.shape for _, t in tensors(fb)]
    assert moved.meta.cu_q == fb.meta.cu_q and moved.logits_count == fb.logits_count
