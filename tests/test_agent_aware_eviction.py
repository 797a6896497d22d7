"""Agent-aware eviction (CacheScout): the transition learner, survival ordering with its LRU
fallback, bounded memory, config selection, and the engine under a cyclic agent workload
(less prefill than LRU, outputs token-identical to naive generate())."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from agentrt import AgentAwarePolicy
from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.errors import ConfigError
from agentrt.kv.eviction import LRUPolicy
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import drain, submit

V = 301
AGENTS = [f"agent{c}" for c in "ABCDEFGH"]


@dataclass
class FakeNode:
    tag: str | None
    last_access: int
    num_pages: int = 1


@dataclass
class FakeSession:
    tag: str | None
    last_used: int


def _cycled(policy, cycles: int) -> list[FakeNode]:
    """Run `cycles` rounds of A..H through the policy; one node per agent, stamped at its use."""
    clock, nodes = 0, {}
    for _ in range(cycles):
        for tag in AGENTS:
            clock += 1
            policy.on_request(tag)
            nodes[tag] = FakeNode(tag, clock)
    policy.check_invariants()
    return list(nodes.values())


def test_cyclic_agents_evict_the_just_used_first_and_the_next_to_run_last():
    policy = AgentAwarePolicy()
    nodes = _cycled(policy, 3)
    order = [n.tag for n in policy.victim_order(nodes)]
    assert order == AGENTS[::-1]  # H just ran (first out), A runs next (kept longest)
    assert [n.tag for n in LRUPolicy().victim_order(nodes)] == AGENTS  # LRU: A out first
    sessions = [FakeSession(n.tag, n.last_access) for n in nodes]
    assert [s.tag for s in policy.order_sessions(sessions)] == AGENTS[::-1]
    assert [s.tag for s in LRUPolicy().order_sessions(sessions)] == AGENTS


def test_unpredicted_tags_go_first_in_lru_order():
    policy = AgentAwarePolicy()
    nodes = _cycled(policy, 2)
    extra = [FakeNode(None, 100), FakeNode("stranger", 50), FakeNode(None, 7)]
    order = policy.victim_order(nodes + extra)
    assert [n.last_access for n in order[:3]] == [7, 50, 100]
    assert [n.tag for n in order[3:]] == AGENTS[::-1]


def test_unpredictable_sequence_falls_back_to_lru():
    rng = random.Random(0)
    policy = AgentAwarePolicy()
    for _ in range(400):
        policy.on_request(rng.choice(AGENTS))
    assert policy.distances() == {}
    nodes = [FakeNode(t, rng.randrange(1000)) for t in AGENTS for _ in range(3)]
    assert policy.victim_order(nodes) == LRUPolicy().victim_order(nodes)


def test_repeats_and_unknown_tags_are_not_transitions():
    policy = AgentAwarePolicy()
    for _ in range(3):
        for tag in ("A", "A", None, "B", "C", None):
            policy.on_request(tag)
    policy.on_request("A")
    assert policy.distances() == {"B": 1, "C": 2, "A": 3}


def test_chain_memory_is_bounded_and_adapts():
    policy = AgentAwarePolicy(max_tags=10, max_successors=3, max_count=8)
    rng = random.Random(1)
    for i in range(500):
        policy.on_request(f"t{rng.randrange(40)}")
        if i % 50 == 0:
            policy.check_invariants()
    assert len(policy.chain) == 10
    for _ in range(20):  # a new stable workflow takes over after the noise
        for tag in ("x", "y", "z"):
            policy.on_request(tag)
    assert policy.distances() == {"x": 1, "y": 2, "z": 3}
    policy.check_invariants()


def test_bad_settings_raise_config_error():
    with pytest.raises(ConfigError):
        EngineConfig(eviction_policy="mru")
    with pytest.raises(ConfigError):
        AgentAwarePolicy(min_probability=0.0)
    with pytest.raises(ConfigError):
        AgentAwarePolicy(max_successors=8, max_count=8)


def test_config_selects_the_policy_for_radix_and_sessions():
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=512, eviction_policy="agent_aware"))
    assert isinstance(core.policy, AgentAwarePolicy) and core.radix.policy is core.policy
    assert isinstance(EngineCore(model, EngineConfig(kv_cache_tokens=512)).policy, AgentAwarePolicy)  # default
    assert isinstance(EngineCore(model, EngineConfig(kv_cache_tokens=512, eviction_policy="lru")).policy, LRUPolicy)
    explicit = LRUPolicy()
    core = EngineCore(model, EngineConfig(kv_cache_tokens=512, eviction_policy="agent_aware"),
                      policy=explicit)
    assert core.policy is explicit and core.radix.policy is explicit


# ---- engine: cyclic agents under memory pressure ---------------------------------------
N_AGENTS, N_TURNS, ANCHOR, MSG, OUT = 8, 6, 64, 16, 8
FINAL = N_AGENTS * (ANCHOR + N_TURNS * (MSG + OUT))  # every history at the end, in tokens


def _workload(seed: int = 1):
    """Per agent: an anchor (its system prompt) then N_TURNS messages, drawn up front."""
    rng = random.Random(seed)
    anchors = [[rng.randrange(V) for _ in range(ANCHOR)] for _ in range(N_AGENTS)]
    msgs = [[[rng.randrange(V) for _ in range(MSG)] for _ in range(N_AGENTS)]
            for _ in range(N_TURNS)]
    return anchors, msgs


def _run_cyclic(policy, oracle: dict, tier: int = 0, kv: int | None = None, arch: str = "llama"):
    """A1 B1 ... H1 A2 ... with a pool holding ~60% of the final histories. Returns the engine
    stats; every output is checked against naive generate() (memoized in `oracle`)."""
    model = tiny_model(arch)
    kv = kv or int(0.6 * FINAL) // 16 * 16
    cfg = EngineConfig(kv_cache_tokens=kv, page_size=16, max_session_seqs=N_AGENTS,
                       response_cache_size=0, kv_tier_bytes=tier)
    core = EngineCore(model, cfg, policy=policy)
    anchors, msgs = _workload()
    hist = [list(a) for a in anchors]
    sessions = [core.open_session(core.pool.acquire("session", 0), tag=f"agent{a}")
                for a in range(N_AGENTS)]
    sp = SamplingParams(max_tokens=OUT)
    for t in range(N_TURNS):
        for a in range(N_AGENTS):
            hist[a] += msgs[t][a]
            r = submit(core, hist[a], sp, session=sessions[a])
            drain(core)
            key = (a, t)
            if key not in oracle:
                oracle[key] = generate(model, hist[a], sp)
            assert r.output == oracle[key], (type(policy).__name__, a, t)
            hist[a] += r.output
    assert sum(map(len, hist)) == FINAL
    for s in sessions:
        core.close_session(s)
        core.check_invariants()
    drain(core)  # nothing running; checks that nothing leaked
    assert not core.sessions and core.pool.num_free("session") == N_AGENTS
    return core.stats()


def test_cyclic_agents_prefill_less_than_lru_with_identical_outputs():
    oracle: dict = {}
    lru = _run_cyclic(LRUPolicy(), oracle)
    aware = _run_cyclic(AgentAwarePolicy(), oracle)
    assert lru.detached_sessions > 0 and aware.detached_sessions > 0
    # sessions give up their tails first under both policies (partial detach), so LRU loses only
    # what each turn needs; predicting the next agent still saves a tenth or more
    ratio = aware.prompt_computed / lru.prompt_computed
    assert ratio <= 0.9, (aware.prompt_computed, lru.prompt_computed)
    assert aware.hit_rate > lru.hit_rate


def test_a_user_policy_gets_every_hook_and_one_without_victim_order_is_refused():
    """An eviction policy object of the user's own: the hooks it leaves out get the base's
    defaults (kv/eviction.py::as_eviction_policy, once, at the engine's start), so the engine
    calls every hook without probing; its own hooks are the ones called. One that cannot rank
    leaves is a ConfigError."""
    from agentrt.kv.eviction import EvictionPolicyBase

    class Newest:  # (no base class: ranks leaves only, most recent first)
        def __init__(self):
            self.ranked = 0

        def victim_order(self, leaves):
            self.ranked += 1
            return sorted(leaves, key=lambda n: -n.last_access)

    mine = Newest()
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(kv_cache_tokens=256, page_size=16, response_cache_size=0), policy=mine)
    assert isinstance(core.policy, EvictionPolicyBase) and core.radix.policy is core.policy
    assert core.policy.distances() == {} and core.policy.name == "Newest"
    sp = SamplingParams(max_tokens=4)
    for i in range(6):  # distinct prompts past the pool: eviction must rank leaves
        prompt = [(7 * i + j) % V for j in range(60)]
        r = submit(core, prompt, sp)
        drain(core)
        assert r.output == generate(model, prompt, sp)
    core.check_invariants()
    assert mine.ranked > 0
    with pytest.raises(ConfigError, match="victim_order"):
        EngineCore(model, EngineConfig(kv_cache_tokens=256), policy=object())
