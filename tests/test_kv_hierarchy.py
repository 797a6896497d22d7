"""The KV memory hierarchy: partial detach, the second tier (demote / promote), prefetch and
tool-aware retention. Oracle: every output equals naive single-sequence greedy decoding on the
tiny Qwen2 (random weights whose outputs depend on the whole context: a wrong page shows);
pool, radix and tier invariants hold after every step (drain checks them)."""

from __future__ import annotations

import random

import pytest
import torch

from agentrt import AgentAwarePolicy
from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.kv.eviction import LRUPolicy
from agentrt.kv.kv_manager import KVManager
from agentrt.kv.pages import PageAllocator
from agentrt.kv.radix import RadixCache
from agentrt.kv.retention import ToolRetention
from agentrt.kv.store import KVStore
from agentrt.kv.tier import HostTier
from agentrt.model.config import ModelConfig
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import drain, submit
from tests.test_agent_aware_eviction import FINAL, _run_cyclic

PS = 4
CFG = ModelConfig(arch="llama", vocab_size=50, hidden_size=8, intermediate_size=16, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=4)
V = 301


# ---- the tree and the tier, as units ----------------------------------------------------
def _tree(pages=8, tier_pages=8):
    alloc = PageAllocator(pages, PS)
    store = KVStore.allocate(CFG, pages, PS)
    kvm = KVManager(alloc, store)
    tier = HostTier(store, tier_pages * 2 * CFG.num_layers * PS * CFG.num_kv_heads * CFG.head_dim * 4)
    return alloc, kvm, RadixCache(alloc, LRUPolicy(), tier)


def _fill(kvm, pages, seed):
    g = torch.Generator().manual_seed(seed)
    for k, v in zip(kvm.store.k, kvm.store.v):
        for p in pages:
            k[p].copy_(torch.randn(k[p].shape, generator=g))
            v[p].copy_(torch.randn(v[p].shape, generator=g))


def _kv(kvm, pages):
    return [torch.stack([k[p] for p in pages]) for k in kvm.store.k + kvm.store.v]


def test_demote_then_promote_restores_the_same_kv():
    alloc, kvm, tree = _tree()
    toks = list(range(12))
    pages = alloc.alloc(3)
    _fill(kvm, pages, 0)
    before = _kv(kvm, pages)
    tree.insert(toks, pages)
    alloc.decref(pages)  # only the tree holds them now
    assert tree.evict(3) == 3 and alloc.num_free == 8
    assert tree.match_prefix(toks).length == 0  # demoted: not matched as resident
    path = tree.host_path(toks)
    assert [n.start for n in path] == [0] and tree.tier.used == 3 * tree.tier.page_bytes
    fresh = alloc.alloc(3)
    tree.promote(path[0], fresh)
    assert all(torch.equal(a, b) for a, b in zip(before, _kv(kvm, fresh)))
    assert tree.match_prefix(toks).length == 12
    tree.check_invariants()
    alloc.check_invariants([tree.all_pages()])


def test_split_of_a_demoted_node_keeps_tier_bytes_exact_and_insert_readopts_pages():
    alloc, kvm, tree = _tree()
    toks = list(range(12))
    pages = alloc.alloc(3)
    tree.insert(toks, pages)
    alloc.decref(pages)
    tree.evict(3)
    other = toks[:4] + [40, 41, 42, 43]  # shares the first page: the demoted node splits
    p2 = alloc.alloc(2)
    tree.insert(other, p2)
    tree.check_invariants()  # (the tier's byte count equals its entries' after the split)
    m = tree.match_prefix(toks)
    assert m.length == 4 and m.pages == p2[:1]  # the shared page, recomputed by the caller: adopted
    assert [(n.start, n.resident) for n in tree.host_path(toks)] == [(4, False)]
    alloc.decref(p2)
    alloc.check_invariants([tree.all_pages()])


def test_a_full_tier_drops_kept_copies_then_demoted_leaves():
    alloc, kvm, tree = _tree(pages=8, tier_pages=2)
    a, b = alloc.alloc(2), alloc.alloc(2)
    tree.insert(list(range(8)), a)
    tree.insert(list(range(20, 28)), b)
    alloc.decref(a)
    alloc.decref(b)
    assert tree.evict(4) == 4
    # room for one of the two: the second demotion drops the older demoted leaf
    assert tree.demoted_pages == 4 and tree.dropped_pages == 2
    assert tree.host_path(list(range(8))) == [] and len(tree.host_path(list(range(20, 28)))) == 1
    tree.check_invariants()
    assert tree.tier.used <= tree.tier.budget


# ---- the engine -------------------------------------------------------------------------
def test_tier_makes_cyclic_agents_compute_little_more_than_their_deltas():
    """8 agents in a cycle, pool at 60% of their histories: with the tier every evicted full
    page comes back by copy; only a cut session's partly filled last page (< 16 tokens, never
    in the tree) is recomputed. Without room in the tier, pages are dropped and recomputed."""
    oracle: dict = {}
    roomy = _run_cyclic(LRUPolicy(), oracle, tier=0, kv=2 * FINAL, arch="qwen2")
    tiered = _run_cyclic(LRUPolicy(), oracle, tier=1 << 30, arch="qwen2")
    assert tiered.demoted_pages > 0 and tiered.promoted_pages > 0 and tiered.prompt_promoted > 0
    assert tiered.dropped_pages == 0
    assert roomy.prompt_computed <= tiered.prompt_computed <= roomy.prompt_computed + 15 * tiered.detached_sessions
    small = _run_cyclic(LRUPolicy(), oracle, tier=4 * 12288, arch="qwen2")  # room for 4 of the tiny model's pages
    assert small.dropped_pages > 0 and small.prompt_computed > tiered.prompt_computed


def _two_agents(cfg_kw=None, anchor=48, turn=16):
    model = tiny_model("qwen2")
    cfg = EngineConfig(kv_cache_tokens=16 * 16, page_size=16, response_cache_size=0,
                       enable_speculation=False, debug_invariants=True, **(cfg_kw or {}))
    core = EngineCore(model, cfg, policy=LRUPolicy())
    rng = random.Random(3)
    head = [rng.randrange(V) for _ in range(anchor)]
    return model, core, head, rng


def test_partial_detach_cuts_the_newest_turns_and_keeps_the_shared_head():
    model, core, head, rng = _two_agents({"kv_tier_bytes": 0})
    sp = SamplingParams(max_tokens=4)
    a = core.open_session(core.pool.acquire("session", 0), tag="a")
    hist = list(head)
    for _ in range(5):  # a grows to 48 + 5 * 20 + ... tokens: 10 of the 16 pages
        hist += [rng.randrange(V) for _ in range(16)]
        r = submit(core, hist, sp, session=a)
        drain(core)
        hist += r.output
    held = len(a.seq.tokens)
    other = head + [rng.randrange(V) for _ in range(100)]  # needs pages: a gives up its tail
    r = submit(core, other, sp)
    drain(core)
    assert r.output == generate(model, other, sp)
    assert core.counters.detached_sessions >= 1
    assert len(head) <= len(a.seq.tokens) < held  # the shared head is still a's, the tail went
    assert core.radix.match_prefix(head).length == len(head)
    hist += [rng.randrange(V) for _ in range(8)]
    r = submit(core, hist, sp, session=a)
    drain(core)
    assert r.output == generate(model, hist, sp)


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetch_promotes_the_predicted_next_agent_and_outputs_do_not_change(prefetch):
    """Two agents taking turns over a pool that holds about one history: the policy learns
    a -> b -> a, and with prefetch b's demoted pages come back during a's decode steps or
    while the loop idles, before b's request arrives. Outputs are the same either way."""
    model = tiny_model("qwen2")
    cfg = EngineConfig(kv_cache_tokens=12 * 16, page_size=16, response_cache_size=0, enable_speculation=False,
                       debug_invariants=True, enable_prefetch=prefetch)
    core = EngineCore(model, cfg, policy=AgentAwarePolicy())
    rng = random.Random(5)
    hist = {t: [rng.randrange(V) for _ in range(64)] for t in "ab"}
    sess = {t: core.open_session(core.pool.acquire("session", 0), tag=t) for t in "ab"}
    sp = SamplingParams(max_tokens=4)
    for turn in range(4):
        for t in "ab":
            hist[t] += [rng.randrange(V) for _ in range(16)]
            core.idle()  # the loop idles between turns
            r = submit(core, hist[t], sp, session=sess[t])
            drain(core)
            assert r.output == generate(model, hist[t], sp), (turn, t)
            hist[t] += r.output
    assert core.counters.promoted_pages > 0
    assert (core.counters.prefetched_pages > 0) == prefetch


def test_tool_ttl_pins_a_session_and_learns_the_tools_duration():
    model, core, head, rng = _two_agents({"kv_tier_bytes": 0})
    sp = SamplingParams(max_tokens=4)
    a = core.open_session(core.pool.acquire("session", 0), tag="a")
    hist = head + [rng.randrange(V) for _ in range(100)]
    r = submit(core, hist, sp, session=a)
    drain(core)
    hist += r.output
    core.costs.s_per_token = 1.0  # an expensive reload: worth a long pin
    core.retention.durations.prior_s = 20.0  # (a pin that outlives a slow machine running this test)
    ttl = core.expect_tools(a, ("search",))
    assert ttl == pytest.approx(25.0)  # no observation yet: the prior, with the 1.25 margin
    held = len(a.seq.tokens)
    drain(core) if submit(core, [rng.randrange(V) for _ in range(64)], sp) else None  # 4 tree pages
    r = submit(core, [rng.randrange(V) for _ in range(70)], sp)  # needs 5 pages: 2 free + those 4
    drain(core)
    assert len(a.seq.tokens) == held  # pinned: the tree's own (more recent) pages went first
    a.pin_until = a.tools_at + 1e-6  # expired: an ordinary candidate again
    r = submit(core, [rng.randrange(V) for _ in range(140)], sp)
    drain(core)
    assert len(a.seq.tokens) < held
    hist += [rng.randrange(V) for _ in range(8)]
    r = submit(core, hist, sp, session=a)
    drain(core)
    assert r.output == generate(model, hist, sp)
    st = core.stats()
    assert st.ttl_pins == 1 and st.ttl_expired == 1 and st.tool_ttls == {"search": pytest.approx(25.0)}


def test_retention_ttl_covers_the_tool_quantile_capped_by_reload_cost():
    ret = ToolRetention(quantile=0.9, margin=1.0, hold_factor=10.0, prior_s=1.0, max_ttl_s=30)
    assert ret.ttl(("t",), reload_s=10.0) == 1.0  # prior
    for d in [0.1] * 9 + [2.0]:
        ret.observe(("t",), d)
    assert 0.1 < ret.ttl(("t",), reload_s=10.0) <= 2.0  # the 90th percentile
    assert ret.ttl(("t",), reload_s=0.01) == pytest.approx(0.1)  # a cheap reload: a short pin
    # a tool not seen min_samples times takes every tool's durations (here t's), not the prior
    assert ret.ttl(("new",), reload_s=10.0) == ret.ttl(("t",), reload_s=10.0) < 1.0
    for _ in range(3):
        ret.observe(("slow",), 5.0)
    assert ret.ttl(("t", "slow"), reload_s=10.0) >= 5.0  # the slowest tool decides
    assert 0.1 <= ret.early("t") < ret.early("slow") == 5.0  # a return prefetch's earliest time
    assert ret.ttl((), reload_s=10.0) == 0.0


def test_restore_tail_brings_back_a_cut_session():
    model, core, head, rng = _two_agents({"kv_tier_bytes": 1 << 30})
    sp = SamplingParams(max_tokens=4)
    a = core.open_session(core.pool.acquire("session", 0), tag="a")
    hist = head + [rng.randrange(V) for _ in range(120)]
    submit(core, hist, sp, session=a)
    drain(core)
    full = list(a.seq.tokens)
    submit(core, [rng.randrange(V) for _ in range(180)], sp)
    drain(core)
    assert len(a.seq.tokens) < len(full)
    core.hierarchy.restore_tail(a)
    core.check_invariants()
    assert a.seq.tokens == full[:len(a.seq.tokens)] and len(a.seq.tokens) >= len(full) // 16 * 16 - 16
    prompt = full + [rng.randrange(V) for _ in range(8)]
    r2 = submit(core, prompt, sp, session=a)
    drain(core)
    assert r2.output == generate(model, prompt, sp)


def test_engine_with_tier_prefetch_and_ttl_under_concurrent_agents_matches_the_oracle():
    """Four agents as concurrent tasks on the async engine, random tool waits, a pool for about
    half their histories: admission, promotion, prefetch (idle loop and decode steps) and TTL
    pins interleave as they will; every reply equals the oracle and nothing leaks."""
    import anyio

    from agentrt.engine.engine import Engine
    from tests.engine_util import assert_quiescent

    model = tiny_model("qwen2")
    cfg = EngineConfig(kv_cache_tokens=40 * 16, page_size=16, response_cache_size=0, debug_invariants=True,
                       max_session_seqs=4)
    sp = SamplingParams(max_tokens=6)
    outs: list[tuple[list[int], list[int]]] = []

    async def agent(eng, i: int) -> None:
        rng = random.Random(i)
        hist = [rng.randrange(V) for _ in range(96)]
        async with await eng.open_session(tag=f"agent{i}") as s:
            for _ in range(4):
                hist += [rng.randrange(V) for _ in range(24)]
                out = (await eng.complete(hist, sp, session=s)).token_ids
                outs.append((list(hist), out))
                hist += out
                await s.expect_tools(["lookup"])
                await anyio.sleep(rng.random() * 0.05)

    async def main():
        async with Engine(model, cfg, policy=AgentAwarePolicy()) as eng:
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(agent, eng, i)
            st = eng.stats()
            assert_quiescent(eng.core)
        return st

    st = anyio.run(main)
    for prompt, out in outs:
        assert out == generate(model, prompt, sp)
    assert st.demoted_pages > 0 and st.promoted_pages > 0
    # 16 hints; a session whose KV was all cut by then has nothing to keep (TTL 0: no pin)
    assert 0 < st.ttl_pins <= 16 and st.ttl_hits + st.ttl_expired <= st.ttl_pins


def test_expect_tools_validates_its_argument_and_returns_the_ttl():
    import anyio

    from agentrt.engine.engine import Engine
    from agentrt.errors import ConfigError

    async def main():
        async with Engine(tiny_model("qwen2"), EngineConfig(kv_cache_tokens=1024)) as eng:
            async with await eng.open_session(tag="a") as s:
                await eng.complete(list(range(1, 40)), SamplingParams(max_tokens=2), session=s)
                for bad in ("search", [""], [3], None):
                    with pytest.raises(ConfigError, match="tool names"):
                        await s.expect_tools(bad)
                ttl = await s.expect_tools(["search"])
                assert 0 <= ttl <= EngineConfig().tool_ttl_max_s
                assert eng.stats().ttl_pins == (ttl > 0)

    anyio.run(main)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_return_prefetch_brings_a_cut_session_back_before_its_tool_returns():
    """A session waiting on a tool is cut under pressure (its pin expired) and demoted to the
    tier. Before the tool can return nothing moves (idle() names the wait); once it is due its
    history comes back, the next turn finds it held (counted as used, the copy saved) and the
    output equals the oracle."""
    model, clock = tiny_model("qwen2"), _Clock()
    cfg = EngineConfig(kv_cache_tokens=16 * 16, page_size=16, response_cache_size=0, enable_speculation=False,
                       debug_invariants=True, kv_tier_bytes=1 << 30)
    core = EngineCore(model, cfg, policy=LRUPolicy(), clock=clock)
    rng, sp = random.Random(3), SamplingParams(max_tokens=4)
    a = core.open_session(core.pool.acquire("session", 0), tag="a")
    hist = [rng.randrange(V) for _ in range(120)]
    r = submit(core, hist, sp, session=a)
    drain(core)
    hist += r.output
    core.retention.durations.prior_s = 10.0  # no observation yet: due after half the prior
    core.expect_tools(a, ("search",))
    a.pin_until = a.tools_at  # (expired at once: pressure may cut it)
    submit(core, [rng.randrange(V) for _ in range(180)], sp)
    drain(core)
    held = len(a.seq.tokens)
    assert held < len(hist) - 16 and core.stats().demoted_pages > 0
    clock.t = 1.0
    wait = core.idle()
    assert wait is not None and 3.0 < wait <= 4.0 and len(a.seq.tokens) == held
    clock.t += wait
    assert core.idle() is None  # prefetched (tried once per wait)
    st = core.stats()
    assert st.prefetched_pages > 0 and len(a.seq.tokens) > held
    clock.t = 6.0
    hist += [rng.randrange(V) for _ in range(8)]
    r = submit(core, hist, sp, session=a)
    drain(core)
    assert r.output == generate(model, hist, sp)
    st = core.stats()
    assert st.prefetch_used_pages == st.prefetched_pages and st.prefetch_used_fraction == 1.0
    assert st.prefetch_saved_s > 0
