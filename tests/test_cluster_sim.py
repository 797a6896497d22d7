"""The cluster simulator (bench/cluster_sim.py): simulated engine replicas on one virtual clock
with placement on top. Checked: session_affine keeps each agent on one replica and, on per-agent
histories, hits the cache more than round_robin; a session moves off an overloaded replica only
when the gap and the move's price say so, and keeps its KV; every call emits exactly its script;
virtual time passes the tools' sleeps; Engine.cached_prefix_len reads the prefix cache without
changing it."""

from __future__ import annotations

import anyio
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import ConfigError
from agentrt.sim import ScriptBook, SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from bench.cluster_route import Overheads, Router, move_session
from bench.cluster_sim import SMOLLM2_135M, Workload, simulate

COSTS = StepCosts("toy", base_s=0.005, per_seq_s=5e-4, per_token_s=2e-4, per_pair_s=1e-8, per_key_s=1e-7,
                  tier_copy_s_per_page=1e-4)
# per-agent histories: every agent its own group (no shared prefix), long turns, room for all
HISTORIES = Workload(agents=8, replicas=4, turns=4, groups=8, prefix_tokens=32, turn_tokens=64, output_tokens=8,
                     tool_s=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2), kv_tokens=8192, migrate_gap=1000)


@pytest.fixture(scope="module")
def runs() -> dict:
    return {p: simulate(p, HISTORIES, COSTS, Overheads(call_overhead=0.01), trace=True)
            for p in ("round_robin", "session_affine")}


def test_session_affine_keeps_each_agent_on_one_replica(runs):
    sa = runs["session_affine"]
    assert sa["migrations"] == 0
    homes: dict[int, set] = {}
    for c in sa["calls"]:
        homes.setdefault(c["agent"], set()).add(c["replica"])
    assert len(homes) == HISTORIES.agents and all(len(h) == 1 for h in homes.values())
    assert len({next(iter(h)) for h in homes.values()}) == HISTORIES.replicas  # spread: 2 agents each
    rr = {c["replica"] for c in runs["round_robin"]["calls"]}
    assert rr == set(range(HISTORIES.replicas))


def test_session_affine_hits_its_history_and_round_robin_does_not(runs):
    sa, rr = runs["session_affine"], runs["round_robin"]
    assert sa["turns"] == rr["turns"] == HISTORIES.agents * HISTORIES.turns
    # past the first turn a session holds everything but the new turn's tokens
    assert all(c["cached"] >= len(c["prompt"]) - HISTORIES.turn_tokens - 16 for c in sa["calls"] if c["turn"] > 0)
    assert sa["hit_rate"] > 0.5
    assert sa["hit_rate"] > rr["hit_rate"] + 0.2


def test_every_call_emits_its_script_and_prompts_grow_by_it(runs):
    book = ScriptBook()
    for policy, r in runs.items():
        by_agent: dict[int, list] = {}
        for c in r["calls"]:
            assert c["output"] == book.output(list(c["prompt"]), HISTORIES.output_tokens), policy
            by_agent.setdefault(c["agent"], []).append(c)
        for calls in by_agent.values():
            calls.sort(key=lambda c: c["turn"])
            for prev, nxt in zip(calls, calls[1:]):
                grown = prev["prompt"] + prev["output"]
                assert nxt["prompt"][:len(grown)] == grown
                assert len(nxt["prompt"]) == len(grown) + HISTORIES.turn_tokens


def test_virtual_time_passes_the_tools_and_the_calls(runs):
    for r in runs.values():
        # each agent sleeps (turns - 1) tools of >= 0.8 x 0.5 s; each call >= the overhead + a step
        assert r["virtual_s"] >= (HISTORIES.turns - 1) * 0.4
        assert r["turn_s_p50"] > 0.01 + COSTS.base_s
        assert r["turn_s_mean"] <= r["turn_s_p99"] or r["turns"] == 1
        assert r["steps"] > 0 and r["imbalance"] >= 1.0


def test_a_session_moves_off_an_overloaded_replica_when_the_move_pays():
    prompt, sp = list(range(3000, 3400)), SamplingParams(max_tokens=8, ignore_eos=True)

    async def main():
        engines = _engines(2)
        async with engines[0], engines[1]:
            router = Router("session_affine", engines, COSTS, Overheads(transfer_fixed=0.05), migrate_gap=2,
                            output_tokens=16)
            home, s = await router.session_for(0, None, "g", len(prompt))
            assert home == 0 and router.homed == [1, 0]
            await engines[0].complete(prompt, sp, session=s)
            router.inflight = [2, 0]  # within the gap: stays
            assert await router.session_for(0, s, "g", len(prompt)) == (0, s)
            pricey = Router("session_affine", engines, COSTS, Overheads(transfer_fixed=100.0), 2, 16)
            pricey.home, pricey.homed, pricey.inflight = {0: 0}, [1, 0], [10, 0]
            assert await pricey.session_for(0, s, "g", len(prompt)) == (0, s)  # the move costs more than the wait
            router.inflight = [10, 0]
            held = s.tokens
            home, moved = await router.session_for(0, s, "g", len(prompt))
            assert (home, router.home[0], router.homed, router.migrations) == (1, 1, [0, 1], 1)
            assert s.closed and moved.engine is engines[1] and moved.tokens == held
            await moved.close()
    sim_run(main)


def test_bad_input_is_a_config_error():
    with pytest.raises(ConfigError):
        simulate("random", HISTORIES, COSTS)
    with pytest.raises(ConfigError):
        Workload(agents=0, replicas=1)
    with pytest.raises(ConfigError):
        Workload(agents=4, replicas=1, groups=3, tool_s=(1.0,))
    with pytest.raises(ConfigError):
        Overheads(transfer_fixed=-1.0)


def _engines(n: int):
    model = SimModel(SMOLLM2_135M)
    cfg = EngineConfig(kv_cache_tokens=4096, kv_tier_bytes=0, response_cache_size=0, enable_speculation=False)
    return [Engine(model, cfg, executor=SimExecutor(model, COSTS)) for _ in range(n)]


def test_cached_prefix_len_reads_the_prefix_cache():
    prompt = list(range(1000, 1100))  # 100 tokens: 6 whole pages of 16

    async def main():
        async with _engines(1)[0] as eng:
            assert eng.cached_prefix_len(prompt) == 0
            await eng.complete(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
            assert eng.cached_prefix_len(prompt + [5, 6]) == 96
            assert eng.cached_prefix_len(prompt[:40]) == 32
            assert eng.cached_prefix_len([7] + prompt) == 0
            assert eng.cached_prefix_len(prompt, cache_salt="other") == 0
            before = eng.stats().hit_rate
            assert eng.cached_prefix_len(prompt) == 96 and eng.stats().hit_rate == before
            with pytest.raises(ConfigError):
                eng.cached_prefix_len("some text")
    sim_run(main)


def test_a_moved_session_keeps_its_kv_and_the_transfer_takes_virtual_time():
    prompt = list(range(2000, 2300))
    sp = SamplingParams(max_tokens=8, ignore_eos=True)

    async def main():
        src, dst = _engines(2)
        async with src, dst:
            s = await src.open_session(tag="a")
            first = await src.complete(prompt, sp, session=s)
            held = s.tokens
            t0 = anyio.current_time()
            moved = await move_session(src, dst, s, "a", lambda n: 1.0 + 0.01 * n)
            assert anyio.current_time() - t0 >= 1.0 + 0.01 * len(held)
            assert s.closed and moved.engine is dst and moved.tokens == held
            nxt = await dst.complete(prompt + first.token_ids + [9] * 20, sp, session=moved)
            assert nxt.usage.cached_tokens >= len(held) - 1
            await moved.close()
    sim_run(main)
