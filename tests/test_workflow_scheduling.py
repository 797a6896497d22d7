"""Workflow-aware scheduling inside the engine (tiny random model): every policy produces the
naive greedy decoder's tokens for every request (scheduling changes order, never output), leaks
no page or slot, and the policies do order a known ready set as designed."""

from __future__ import annotations

import random

import pytest

from agentrt import Engine, EngineConfig, Workflow, task_scope
from agentrt.engine.core import EngineCore
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from agentrt.scheduling.policies import SCHEDULING_POLICIES
from tests.conftest import tiny_model
from tests.engine_util import drain, submit

PREFIX, SUFFIX, PS = 96, 12, 16
STAGES = ("A", "B", "C")


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2")


def _prefixes(vocab: int) -> dict[str, list[int]]:
    rng = random.Random(5)
    return {s: [rng.randrange(3, vocab) for _ in range(PREFIX)] for s in STAGES}


def _core(model, policy: str, pages: int = 24) -> EngineCore:
    cfg = EngineConfig(kv_cache_tokens=pages * PS, page_size=PS, response_cache_size=0, kv_tier_bytes=0,
                       scheduling_policy=policy, debug_invariants=True, enable_speculation=False)
    core = EngineCore(model, cfg)
    core.tasks.declare(Workflow.chain("abc", *STAGES))
    return core


def _chain_run(model, policy: str):
    """Tasks through A -> B -> C; a stage's request is submitted when the previous one ends.
    Returns {(task, stage): (prompt, output)} and the admission order."""
    pre, rng = _prefixes(model.cfg.vocab_size), random.Random(11)
    core, sp = _core(model, policy), SamplingParams(max_tokens=6, ignore_eos=True)
    live, done, admitted = {}, {}, []

    def start(task: int, stage: int) -> None:
        prompt = pre[STAGES[stage]] + [rng.randrange(3, model.cfg.vocab_size) for _ in range(SUFFIX)]
        live[(task, stage)] = (prompt, submit(core, prompt, sp, tag=STAGES[stage], task=f"t{task}", workflow="abc"))

    for t in range(4):
        start(t, 0)
    steps = 0
    while core.has_work():
        core.step()
        core.check_invariants()
        admitted += [(k, r.admitted_at) for k, (_, r) in live.items() if r.admitted_at and (k, r.admitted_at) not in admitted]
        for (t, s), (prompt, r) in list(live.items()):
            if r.finish_reason is not None:
                done[(t, s)] = (prompt, r.output)
                del live[(t, s)]
                if s + 1 < len(STAGES):
                    start(t, s + 1)
        steps += 1
        if steps == 3:  # a second wave of tasks arrives mid-run
            for t in range(4, 7):
                start(t, 0)
    drain(core)
    return core, done, [k for k, _ in sorted(admitted, key=lambda x: x[1])]


@pytest.mark.parametrize("policy", SCHEDULING_POLICIES)
def test_every_policy_is_token_identical_and_leak_free(model, policy):
    core, done, _ = _chain_run(model, policy)
    assert len(done) == 7 * len(STAGES)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    for key, (prompt, out) in sorted(done.items())[::4]:  # (every 4th: the oracle is slow-ish)
        assert out == generate(model, prompt, sp), (policy, key)
    st = core.stats()
    assert st.tasks == 7 and st.scheduling_policy == policy
    assert (st.decisions > 0) == (policy != "fcfs")
    assert st.decision_us_p50 >= 0.0


def test_policies_order_a_known_ready_set(model):
    """A's prefix resident (one warm request ran), then ready at once: two new A tasks and
    one old task's C request. LPM admits A first; SRPT and program-level FCFS admit C first."""
    firsts = {}
    for policy in ("fcfs", "lpm", "srpt", "program_fcfs"):
        pre, sp = _prefixes(model.cfg.vocab_size), SamplingParams(max_tokens=4, ignore_eos=True)
        core = _core(model, policy, pages=64)
        cfg_old = submit(core, pre["A"] + [7] * SUFFIX, sp, tag="A", task="old", workflow="abc")
        drain(core)  # the old task went through A; its prefix is in the tree
        assert cfg_old.finish_reason == "length"
        core.tasks.observe("old", "abc", "B", 0.0)  # (its B stage ran elsewhere)
        a1 = submit(core, pre["A"] + [8] * SUFFIX, sp, tag="A", task="n1", workflow="abc")
        a2 = submit(core, pre["A"] + [9] * SUFFIX, sp, tag="A", task="n2", workflow="abc")
        c = submit(core, pre["C"] + [5] * SUFFIX, sp, tag="C", task="old", workflow="abc")
        reqs = {"a1": a1, "a2": a2, "c": c}
        core.scheduler.admit()
        firsts[policy] = min(reqs, key=lambda k: reqs[k].admitted_at or 10**9)
        drain(core)
    assert firsts["fcfs"] == "a1" and firsts["lpm"] == "a1"
    assert firsts["srpt"] == "c" and firsts["program_fcfs"] == "c"


@pytest.mark.anyio
async def test_engine_generate_carries_task_scope(model):
    async with Engine(model, EngineConfig(kv_cache_tokens=1024, scheduling_policy="topas")) as eng:
        eng.declare_workflow(Workflow.chain("abc", *STAGES))
        with task_scope("job-9", workflow="abc"):
            async for _ in eng.generate([5, 6, 7, 8], SamplingParams(max_tokens=3), tag="A"):
                pass
        async for _ in eng.generate([5, 6, 7, 9], SamplingParams(max_tokens=3), tag="B", task="job-9"):
            pass
        t = eng.core.tasks.tasks["job-9"]
        assert t.workflow == "abc" and t.stage == "B" and t.requests == 2
        with pytest.raises(Exception, match="task"):
            async for _ in eng.generate([5, 6], SamplingParams(max_tokens=1), task=""):
                pass
