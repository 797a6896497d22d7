"""No preemption loop: requests that cannot run together are held back, and a request preempted
once is admitted again only alone (scheduling/admission.py::Footprint, scheduling/scheduler.py::admit).

The symptom: session turns of ~1,160 tokens on a pool of about two of them. A waiting request
refused by the footprint check stayed attached, holding its session's pages, so the running one
could not grow: it preempted itself, was admitted again at once, and after 32 rounds failed with
OutOfKVMemory (165 preemptions, 5 of 6 conversations lost). Oracle: naive decoding of each turn.
"""

from __future__ import annotations

import random

import anyio

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import OutOfKVMemory
from agentrt.model.generate import generate
from tests.conftest import tiny_native_with_tokenizer
from tests.engine_util import assert_quiescent

PARAMS = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)


def _prompt(i: int, n: int) -> list[int]:
    rng = random.Random(i)
    return [rng.randrange(100, 40000) for _ in range(n)]


def test_a_request_larger_than_the_admission_budget_is_never_preempted_in_a_loop():
    lm = tiny_native_with_tokenizer()
    outputs: dict[int, list] = {}

    async def conversation(eng: Engine, i: int) -> None:
        first = _prompt(i, 930)
        async with await eng.open_session() as s:
            a = await eng.complete(first, PARAMS, session=s)
            await s.expect_tools(["lookup"])  # pinned while its tool runs, as an agent's session is
            second = first + a.token_ids + first[:200]
            b = await eng.complete(second, PARAMS, session=s)
        outputs[i] = [(first, a.token_ids), (second, b.token_ids)]

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=2048)) as eng:
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(conversation, eng, i)
            st = eng.stats()
            await eng.run_in_step_thread(eng.core.check_invariants)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            return st

    st = anyio.run(main)
    assert sorted(outputs) == list(range(6))  # every conversation finished (none OutOfKVMemory)
    assert st.preemptions <= 6, st.preemptions  # at most once each, never a loop
    for turns in outputs.values():
        for prompt, out in turns[1:]:
            assert out == generate(lm.model, prompt, PARAMS, eos_token_ids=lm.tokenizer.eos_token_ids)


def test_a_request_that_can_never_fit_fails_at_once():
    async def main():
        async with Engine(tiny_native_with_tokenizer(), EngineConfig(kv_cache_tokens=1024)) as eng:
            try:
                await eng.complete(_prompt(1, 1100), PARAMS)
            except OutOfKVMemory as e:
                return eng.stats().preemptions, str(e)
        return None

    preemptions, message = anyio.run(main)
    assert preemptions == 0 and "can never fit" in message
