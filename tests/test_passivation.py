"""More agents than session ids: 64 agents over 16 (runtime/leases.py). Idle agents are
passivated (session closed, KV to the prefix cache / tier) and activated on their next turn.

Oracles: every agent's next greedy reply, after passivations, equals naive single-sequence
decoding of its history (`agentrt.model.generate.generate`); the engine's invariants and
quiescence (no session id or page leaked) once the agents stop.
"""

from __future__ import annotations

import anyio
import pytest

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool
from agentrt.conversation.engine_text import chat_format_of
from agentrt.errors import AgentrtError
from agentrt.model.generate import generate
from tests.conftest import tiny_native_with_tokenizer
from tests.engine_util import assert_quiescent

AGENTS, IDS = 64, 16


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key[:8]}"


def _agent(i: int) -> Agent:
    return Agent(f"a{i}", f"You are agent {i}. Call lookup.", [lookup], tool_choice="required", max_tool_rounds=1,
                 settings=SamplingParams(max_tokens=24, temperature=0))


async def _next_output(rt: Runtime, eng: Engine, lm, agent: Agent) -> bool:
    """The agent's next greedy reply on its (re)activated session == naive decoding of its history."""
    await rt.sessions.acquire(agent)
    try:
        prompt = agent.tokens + chat_format_of(eng).generation_prompt_tokens()
        params = SamplingParams(max_tokens=6, temperature=0)
        out = await eng.complete(prompt, params, session=agent.session)
    finally:
        rt.sessions.release(agent)
    return out.token_ids == generate(lm.model, prompt, params, eos_token_ids=lm.tokenizer.eos_token_ids)


def test_64_agents_run_over_16_session_ids():
    lm = tiny_native_with_tokenizer()
    cfg = EngineConfig(kv_cache_tokens=4096, max_session_seqs=IDS, debug_invariants=True)

    async def main():
        async with Engine(lm, cfg) as eng:
            async with Runtime(eng) as rt:
                agents = [_agent(i) for i in range(AGENTS)]
                refs = [await rt.spawn(a) for a in agents]  # each start past 16 passivates an idle agent
                for turn in range(2):
                    async with anyio.create_task_group() as tg:
                        for i, ref in enumerate(refs):
                            tg.start_soon(ref.ask, f"turn {turn}: look up key {i}")
                    held = sum(a.session is not None for a in agents)
                    assert held <= IDS
                assert rt.sessions.passivations >= AGENTS - IDS and rt.sessions.activations >= AGENTS - IDS
                assert all(len(a.messages) >= 1 + 2 * 3 for a in agents)  # system + 2 x (user, call, result, answer)
                same = [await _next_output(rt, eng, lm, a) for a in agents[::7]]
                stats = eng.stats()
                await rt.stop_all()
            assert all(same), same
            assert stats.sessions <= IDS
            await eng.run_in_step_thread(eng.core.check_invariants)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            assert eng.core.pool.num_free("session") == IDS

    anyio.run(main)


def test_a_waiting_agent_gets_the_id_of_the_next_turn_to_end():
    """With every id held by a busy agent, the next agent waits (it is not refused) and runs as soon
    as a turn ends and its agent can be passivated."""
    lm = tiny_native_with_tokenizer()
    cfg = EngineConfig(kv_cache_tokens=4096, max_session_seqs=2)

    async def main():
        async with Engine(lm, cfg) as eng, Runtime(eng) as rt:
            refs = [await rt.spawn(_agent(i)) for i in range(5)]
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for ref in refs:
                        tg.start_soon(ref.ask, "look up key k")
            assert all(len(r.behavior.messages) >= 4 for r in refs)
            assert rt.sessions.passivations >= 3

    anyio.run(main)


def test_a_passivated_agent_is_forked_and_stopped_cleanly():
    lm = tiny_native_with_tokenizer()
    cfg = EngineConfig(kv_cache_tokens=4096, max_session_seqs=1)

    async def main():
        async with Engine(lm, cfg) as eng:
            async with Runtime(eng) as rt:
                a, b = await rt.spawn(_agent(0)), await rt.spawn(_agent(1))
                await a.ask("look up key x")
                assert b.behavior.session is None and a.behavior.session is not None
                fork = await rt.fork(b, name="b2")  # a passivated agent forks its history, not a session
                await fork.ask("look up key y")
                assert fork.behavior.messages[:len(b.behavior.messages)] == b.behavior.messages
                await rt.stop_all()
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            assert eng.core.pool.num_free("session") == 1

    anyio.run(main)


def test_an_engine_without_session_ids_is_a_clear_error():
    async def main():
        async with Engine(tiny_native_with_tokenizer(), EngineConfig(max_session_seqs=0)) as eng, Runtime(eng) as rt:
            ref = await rt.spawn(_agent(0))
            with pytest.raises(AgentrtError, match="max_session_seqs"):
                await ref.ask("look up key x")

    anyio.run(main)


@pytest.mark.parametrize("session", ["keep", "reset"])
def test_an_agent_crashing_past_its_restart_budget_releases_its_session(session):
    """Crashes within the budget restart the agent (keeping or resetting its session); the crash
    past it stops the agent for good, and its session id goes back to the pool (found by the
    surface fuzzer: a kept session leaked when the restart never came)."""
    from agentrt import Supervision

    lm = tiny_native_with_tokenizer()
    cfg = EngineConfig(kv_cache_tokens=2048, max_session_seqs=3, debug_invariants=True)

    async def main():
        async with Engine(lm, cfg) as eng:
            async with Runtime(eng, shutdown_timeout=5) as rt:
                ref = await rt.spawn(_agent(0), supervision=Supervision(max_restarts=1, window_s=60, backoff_s=0,
                                                                         session=session))
                for _ in range(2):  # 5 is not a message: a ConfigError crash, then a restart, then stop
                    with pytest.raises(AgentrtError):
                        await ref.ask(5)
                with anyio.fail_after(10):
                    await rt.actors[ref.name].join()
                assert eng.core.pool.num_free("session") == cfg.max_session_seqs
                await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))

    anyio.run(main)
