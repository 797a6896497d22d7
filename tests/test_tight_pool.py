"""No livelock in a tight KV pool (issue 46, item 4): the seed's regime of a pool that holds about
1.25 stage prefixes, on the real engine, under FCFS, LPM and TOPAS.

A diamond workflow (A -> {B, C} -> D), each stage an agent with its own 400-token prefix and two
model calls with a tool between them; tasks arrive close together, so stages of several tasks
compete for a pool that holds one prefix and a quarter beside the running requests' suffixes. A
request that cannot run now waits for room (the footprint check holds it back; a preempted one
is admitted again only alone); one fails only when it cannot fit even alone. So every task
finishes, preemptions stay within the admissions (each request admitted once, plus once per
preemption: at most one preemption per request), nothing leaks,
and every call's output equals naive greedy decoding of its prompt.
"""

from __future__ import annotations

import random

import anyio
import pytest

from agentrt import Engine, EngineConfig, SamplingParams, Workflow
from agentrt.model.generate import generate
from agentrt.scheduling.preemption import preempt
from tests.conftest import tiny_model
from tests.engine_util import assert_quiescent

PREFIX, SUFFIX, RESULT = 400, 30, 30
PARAMS = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
EDGES = [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]
TASKS = 6


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 300) for _ in range(n)]


def _pool_tokens() -> int:
    """1.25 prefixes, and beside them half of what four concurrent requests add to theirs."""
    work = 4 * (SUFFIX + RESULT + 2 * PARAMS.max_tokens)
    return (int(1.25 * PREFIX + 0.5 * work) + 15) // 16 * 16


async def _run(policy: str, sessions: bool, decision_trace: int = 0, on_close=None) -> tuple[dict, list, object]:
    """Every task of the workload through one engine: (tasks finished, (prompt, output) of
    every call, the engine's stats); `on_close({"trace": ...})` gets the decision trace."""
    model = tiny_model()
    wf = Workflow.from_edges("diamond", EDGES)
    preds = {s: [a for a, b in EDGES if b == s] for s in wf.stages}
    prefixes = {s: _ids(random.Random(f"prefix-{s}"), PREFIX) for s in wf.stages}
    calls: list[tuple[list[int], list[int]]] = []
    finished: dict[str, int] = {}
    cfg = EngineConfig(kv_cache_tokens=_pool_tokens(), scheduling_policy=policy, response_cache_size=0,
                       enable_speculation=False, kv_tier_bytes=0, debug_invariants=True,
                       decision_trace=decision_trace)
    async with Engine(model, cfg) as eng:
        eng.declare_workflow(wf)

        async def stage(task: int, s: str, done: dict) -> None:
            for p in preds[s]:
                await done[p].wait()
            rng = random.Random(f"{task}-{s}")
            prompt = prefixes[s] + _ids(rng, SUFFIX)
            session = await eng.open_session(tag=s) if sessions else None
            try:
                for k in range(2):
                    out = await eng.complete(prompt, PARAMS, tag=s, task=f"t{task}", workflow="diamond",
                                             session=session)
                    calls.append((list(prompt), out.token_ids))
                    prompt = prompt + out.token_ids + _ids(rng, RESULT)
                    if session is not None:
                        await session.expect_tools(["lookup"])  # pinned while its tool runs
                    await anyio.sleep(0.01 * rng.random())  # the tool
            finally:
                if session is not None:
                    await session.close()
            done[s].set()

        async def task(i: int) -> None:
            await anyio.sleep(0.02 * i)
            done = {s: anyio.Event() for s in wf.stages}
            async with anyio.create_task_group() as tg:
                for s in wf.stages:
                    tg.start_soon(stage, i, s, done)
            finished[f"t{i}"] = 1

        with anyio.fail_after(300):
            async with anyio.create_task_group() as tg:
                for i in range(TASKS):
                    tg.start_soon(task, i)
        st = eng.stats()
        if on_close is not None:
            on_close({"trace": eng.decision_trace()})
        await eng.run_in_step_thread(eng.core.check_invariants)
        await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
    return finished, calls, st


@pytest.mark.parametrize("sessions", [False, True], ids=["transient", "sessions"])
@pytest.mark.parametrize("policy", ["fcfs", "lpm", "topas"])
def test_a_pool_of_one_and_a_quarter_prefixes_finishes_every_task(policy, sessions):
    finished, calls, st = anyio.run(_run, policy, sessions)
    assert len(finished) == TASKS
    assert len(calls) == TASKS * 4 * 2
    assert st.admissions == len(calls) + st.preemptions  # each call once, and again after each preemption
    assert st.preemptions <= st.admissions - st.preemptions  # at most one preemption per call
    model = tiny_model()
    for prompt, out in calls:
        assert out == generate(model, prompt, PARAMS)


def test_a_request_preempted_again_and_again_waits_instead_of_failing():
    """The old guard failed a request after 32 preemptions although it could have waited. Here
    pressure from outside (a forced preemption after each step it runs) takes one request's KV
    40 times: it is queued again each time and finishes with naive decoding's tokens."""
    from agentrt.engine.core import EngineCore
    from tests.engine_util import drain, submit

    model = tiny_model()
    core = EngineCore(model, EngineConfig(kv_cache_tokens=1024, page_size=16, response_cache_size=0))
    prompt = _ids(random.Random(1), 120)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    r = submit(core, prompt, params)
    while r.preemptions < 40 and r.finish_reason is None:
        core.step()
        if r in core.running:
            assert preempt(core.mem, core.scheduler.queues, r) is None, f"failed after {r.preemptions} preemptions"
    drain(core)
    assert r.finish_reason == "length"
    assert r.output == generate(model, prompt, params)


def test_a_request_fails_only_when_it_cannot_fit_even_alone():
    """Pages nobody can evict (held outside the engine's structures here) leave a lone request
    too little room: it waits once (its own KV may have been what pinned the rest), then, preempted
    alone again, fails with OutOfKVMemory saying so and frees what it held; a request after it
    that fits runs."""
    from agentrt.engine.core import EngineCore
    from agentrt.errors import OutOfKVMemory
    from tests.engine_util import submit

    model = tiny_model()
    core = EngineCore(model, EngineConfig(kv_cache_tokens=512, page_size=16, response_cache_size=0))
    held = core.alloc.alloc(core.alloc.num_pages - 8)  # 8 pages (128 tokens) left to the engine
    events = []
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    r = core.add_request(_ids(random.Random(2), 100), params, events.append, seq_id=core.pool.acquire("transient", 0))
    for _ in range(200):
        if r.finish_reason is not None:
            break
        core.step()
    assert r.finish_reason == "error" and r.preemptions == 2
    err = [e.error for e in events if e.finish_reason == "error"][0]
    assert isinstance(err, OutOfKVMemory) and "even alone" in str(err)
    core.alloc.decref(held)
    assert core.alloc.num_free == core.alloc.num_pages and not core.running and not core.waiting
    small = submit(core, _ids(random.Random(3), 20), SamplingParams(max_tokens=4, temperature=0))
    while core.has_work():
        core.step()
    assert small.output == generate(model, small.prompt, SamplingParams(max_tokens=4, temperature=0))
