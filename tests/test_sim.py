"""The simulator (agentrt.sim): the engine core's real code over a cost model on a virtual
clock. Checked: a simulated engine emits exactly the scripted tokens and its virtual time is the
modelled step costs plus the tools' sleeps; a workload run for real and then simulated from the
real run's recorded outputs makes the same cache decisions (same counters); the cost model's fit
recovers known coefficients, round-trips through JSON and refuses bad values."""

from __future__ import annotations

import random

import anyio
import numpy as np
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import ConfigError
from agentrt.sim import ScriptBook, SimExecutor, SimModel, StepCosts
from agentrt.sim import run as sim_run
from agentrt.sim.costs import features
from tests.conftest import tiny_native

COSTS = StepCosts("toy", base_s=0.005, per_seq_s=5e-4, per_token_s=2e-4, per_pair_s=1e-8, per_key_s=1e-7,
                  tier_copy_s_per_page=1e-4)
CFG = EngineConfig(kv_cache_tokens=16 * 24, response_cache_size=0, enable_speculation=False, debug_invariants=True)


def _histories(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(1, 300) for _ in range(48)]
    return [head + [rng.randrange(1, 300) for _ in range(20 + 7 * i)] for i in range(n)]


async def _agents(eng, prompts, turns: int, tool_s: float, concurrent: bool, book=None) -> list[list[int]]:
    """Each agent: a session, `turns` turns (prompt grows by its output and 5 tokens), a tool sleep."""
    outs: list[list[int]] = [[] for _ in prompts]

    async def agent(i: int) -> None:
        s, p = await eng.open_session(tag=f"a{i}"), list(prompts[i])
        for t in range(turns):
            c = await eng.complete(p, SamplingParams(max_tokens=6, ignore_eos=True), session=s)
            if book is not None:
                book.record(p, c.token_ids)
            outs[i].extend(c.token_ids)
            p = p + c.token_ids + [7, 8, 9, 10, 11]
            await anyio.sleep(tool_s)
        await s.close()
    if concurrent:
        async with anyio.create_task_group() as tg:
            for i in range(len(prompts)):
                tg.start_soon(agent, i)
    else:
        for i in range(len(prompts)):
            await agent(i)
    return outs


def test_a_simulated_engine_emits_the_script_and_takes_the_modelled_time():
    model = SimModel(tiny_native("llama").cfg)
    ex, prompts = SimExecutor(model, COSTS), _histories(3)

    async def main():
        async with Engine(model, CFG, executor=ex) as eng:
            t0 = anyio.current_time()
            outs = await _agents(eng, prompts, turns=2, tool_s=0.25, concurrent=False)
            await eng.run_in_step_thread(eng.core.check_invariants)
            return outs, anyio.current_time() - t0, eng.stats()
    outs, virtual, st = sim_run(main)
    assert all(len(o) == 12 for o in outs) and ex.scripts.synthesized == 6  # one script per turn
    assert virtual == pytest.approx(ex.busy_s + 6 * 0.25, rel=1e-9)  # one agent at a time: costs + tools
    assert ex.busy_s >= ex.steps * COSTS.base_s and st.hit_rate > 0


@pytest.mark.parametrize("concurrent", [False, True])
def test_replaying_a_real_run_makes_the_same_cache_decisions(concurrent):
    """The same workload for real (tiny model) and simulated from the recorded outputs: the
    tokens are the same; with agents run one at a time the interleaving is the same too, so the
    engine core's code decides the same (prompt tokens cached, computed, evictions, steps)."""
    tiny, prompts = tiny_native("qwen2"), _histories(4, seed=2)

    async def real():
        book = ScriptBook()
        async with Engine(tiny, CFG) as eng:
            outs = await _agents(eng, prompts, 3, 0.0, concurrent, book)
            return outs, eng.stats(), book

    async def simulated(book):
        model = SimModel(tiny.cfg, tiny.kv_dtype)
        async with Engine(model, CFG, executor=SimExecutor(model, COSTS, book)) as eng:
            return await _agents(eng, prompts, 3, 0.0, concurrent), eng.stats()
    r_out, r_st, book = anyio.run(real)
    s_out, s_st = sim_run(simulated, book)
    assert s_out == r_out  # the scripts replay the real tokens, so every later prompt is the same
    keys: tuple[str, ...] = ("prompt_submitted",)  # concurrent: the interleaving follows the timing, and
    if not concurrent or r_st.preemptions == s_st.preemptions == 0:  # a preempted sequence's recompute
        keys += ("decode_tokens",)  # of its output counts as decoded tokens again
    if not concurrent:
        keys += ("prompt_cached", "prompt_computed", "evicted_pages", "detached_sessions", "preemptions", "steps")
    assert {k: getattr(s_st, k) for k in keys} == {k: getattr(r_st, k) for k in keys}


def test_cost_fit_recovers_known_coefficients_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    shapes = [[(int(rng.integers(0, 3000)), int(rng.choice([1, 1, 16, 256, 1024])))
               for _ in range(int(rng.integers(1, 9)))] for _ in range(60)]
    samples = [(s, COSTS.seconds(s)) for s in shapes]
    fit = StepCosts.fit(samples, name="fit", tier_copy_s_per_page=1e-4)
    np.testing.assert_allclose(fit.coefficients, COSTS.coefficients, rtol=1e-6, atol=1e-12)
    assert StepCosts.load(fit.save(tmp_path / "c.json")) == fit
    assert features([(10, 1), (0, 4)]) == (1.0, 2.0, 5.0, 11.0 + 10.0, 15.0)


def test_bad_cost_models_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="per_token_s must be a number >= 0"):
        StepCosts("bad", 0.0, 0.0, -1.0, 0.0, 0.0, 0.0)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read a cost model"):
        StepCosts.load(tmp_path / "x.json")


def test_step_observers_see_every_step_and_one_that_raises_is_only_logged():
    """EngineCore.step_observers (what calibration times): each gets (chunks, seconds) once per
    step that ran the model; an observer that raises does not fail the step or the request."""
    from agentrt.engine.core import EngineCore

    core = EngineCore(tiny_native("llama"), CFG)
    seen: list = []
    core.step_observers += [lambda ch, dt: seen.append((sum(len(c.tokens) for c in ch), dt)),
                            lambda ch, dt: 1 / 0]
    events: list = []
    core.add_request(list(range(5, 45)), SamplingParams(max_tokens=4, ignore_eos=True), events.append,
                     seq_id=core.pool.acquire("transient", 0))
    steps = 0
    while core.has_work():
        steps += core.step() > 0
    assert len(seen) == steps and sum(n for n, _ in seen) == 40 + 3 and all(dt > 0 for _, dt in seen)
    assert events[-1].finish_reason == "length" and events[-1].error is None
    core.check_invariants()


def test_a_simulation_is_deterministic_when_tasks_wake_at_one_instant():
    """Agents released at one instant (every tool sleeps the same virtual time) reach the engine
    in the order they were woken (agentrt.sim.run: a FIFO asyncio loop on a virtual clock), so
    the same workload gives the same admissions, steps and virtual time, run after run (paired
    policy comparisons then differ only by the policies)."""
    model = SimModel(tiny_native("llama").cfg)
    prompts = _histories(6, seed=3)

    async def main():
        ex = SimExecutor(model, COSTS)
        async with Engine(model, CFG.replace(scheduling_policy="lpm", decision_trace=4096), executor=ex) as eng:
            t0 = anyio.current_time()
            await _agents(eng, prompts, turns=3, tool_s=0.25, concurrent=True)
            trace = eng.decision_trace()
            return [(d["order"], d["admitted"]) for d in trace], anyio.current_time() - t0, ex.steps

    first = sim_run(main)
    assert len(first[0]) > 3
    assert all(sim_run(main) == first for _ in range(4))


def test_the_simulated_tier_counts_the_real_page_size_and_charges_copies():
    """A simulated engine with a tier (SimTier: entries of the real model's page size, no bytes)
    demotes and promotes pages; its byte count is whole pages of the real model; every copy
    adds its cost to the virtual time."""
    from agentrt.kv.store import KVStore

    model = SimModel(tiny_native("llama").cfg)
    ex = SimExecutor(model, COSTS)
    cfg = CFG.replace(kv_tier_bytes=1 << 22)

    async def main():
        async with Engine(model, cfg, executor=ex) as eng:
            await _agents(eng, _histories(8), turns=3, tool_s=0.25, concurrent=True)
            await eng.run_in_step_thread(eng.core.check_invariants)
            return eng.stats()
    st = sim_run(main)
    page_bytes = KVStore.bytes_per_token(model.cfg, model.kv_dtype) * cfg.page_size
    assert st.demoted_pages > 0 and st.promoted_pages > 0
    assert st.tier_bytes == st.tier_pages * page_bytes
    copies = (st.demoted_pages + st.promoted_pages) * COSTS.copy_s(1, cfg.page_size)
    assert ex.busy_s >= ex.steps * (COSTS.base_s + COSTS.loop_s) + copies * (1 - 1e-9)
