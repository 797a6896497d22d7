"""Context overflow: huge tool results are cut (and encoded off the event loop); a conversation that
outgrows the context drops its oldest tool rounds / exchanges (or raises), re-encoding only the
changed suffix."""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool
from agentrt.conversation.conversation import Conversation
from agentrt.conversation.overflow import ContextPolicy, droppable
from agentrt.errors import ConfigError, ContextLengthExceeded
from tests.conftest import smol_tokenizer, tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent


def test_a_1mb_tool_result_is_cut_with_a_marker_without_tokenizing_it_whole():
    tok = smol_tokenizer()
    calls = []

    class Counting:
        def encode(self, text, special=False):
            calls.append(len(text))
            return tok.encode(text, special=special)

        def decode(self, ids):
            return tok.decode(ids)

    big = "0123456789abcdef" * 65536  # 1 MiB
    cut = ContextPolicy(tool_result_tokens=256).cut_tool_result(Counting(), big)
    assert cut.endswith("tokens shown]") and "truncated: the first 256 of about" in cut
    assert len(tok.encode(cut.split("\n[... truncated")[0])) <= 256
    assert max(calls) <= 256 * 16  # only a head was tokenized
    assert ContextPolicy().cut_tool_result(tok, "short") == "short"
    assert ContextPolicy(tool_result_tokens=None).cut_tool_result(tok, big) is big


def test_droppable_keeps_the_system_prompt_and_the_latest_exchange():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msgs = [{"role": "system", "content": "s"},                                              # 0
            {"role": "user", "content": "q1"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c", "content": "r"}, {"role": "assistant", "content": "a1"},  # 1-4
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"},                  # 5-6
            {"role": "user", "content": "q3"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    assert droppable(msgs) == [[2, 3], [1, 2, 3, 4], [5, 6]]
    with pytest.raises(ConfigError):
        ContextPolicy(mode="drop")


def _run(fn, kv_tokens=8192):
    lm = tiny_model_with_tokenizer()

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=kv_tokens, response_cache_size=0,
                                           debug_invariants=True)) as eng:
            out = await fn(eng)
            assert_quiescent(eng.core)
            return out
    return anyio.run(main)


def test_huge_tool_result_does_not_wedge_the_agent():
    """Symptom: a tool returning 1 MB put ~131k tokens in the history and every later turn failed
    with ContextLengthExceeded."""
    @tool
    def dump(what: Literal["logs"]) -> str:
        """Dump something."""
        return "line of log output\n" * 55000  # ~1 MB

    async def fn(eng):
        agent = Agent("a", "You read logs.", [dump], tool_choice="dump", max_tool_rounds=1,
                      settings=SamplingParams(max_tokens=40), context_policy=ContextPolicy(tool_result_tokens=512))
        async with Runtime(eng) as rt:
            ref = await rt.spawn(agent, name="a")
            first = await ref.ask("Show the logs.")
            second = await ref.ask("Anything else?")  # used to raise ContextLengthExceeded
        return first, second, agent

    first, second, agent = _run(fn)
    tool_msg = next(m for m in agent.messages if m["role"] == "tool")
    assert "[... truncated: the first 512 of about" in tool_msg["content"] and len(agent.tokens) < 2000
    assert first.tool_results[0].name == "dump" and second.text is not None


@pytest.mark.parametrize("mode", ["trim", "raise"])
def test_a_conversation_that_outgrows_the_context(mode):
    async def fn(eng):
        limit = eng.max_context_tokens
        session = await eng.open_session()
        conv = Conversation(eng, session=session, policy=ContextPolicy(mode=mode))
        conv.append([{"role": "system", "content": "You are terse."}])
        system_end = conv.ends[1]
        params = SamplingParams(max_tokens=16)
        usages = []
        try:
            for n in range(40):
                conv.append([{"role": "user", "content": f"question {n}: " + "words " * 40}])
                async for ev in conv.round(params):
                    pass
                usages.append(ev.usage)
                assert len(conv.tokens) <= limit
        except ContextLengthExceeded as exc:
            await session.close()
            return "raised", str(exc), conv, usages, system_end, limit
        await session.close()
        return "ok", "", conv, usages, system_end, limit

    outcome, message, conv, usages, system_end, limit = _run(fn, kv_tokens=1024)
    if mode == "raise":
        assert outcome == "raised" and "start a new conversation" in message
        return
    assert outcome == "ok" and conv.dropped > 0
    assert conv.messages[0] == {"role": "system", "content": "You are terse."}
    assert conv.messages[-2]["content"].startswith("question 39:")
    # after a drop only the changed suffix is recomputed: the system prompt stays in the KV
    assert all(u.cached_tokens >= system_end - 1 for u in usages[1:])
    assert len(conv.originals) == len(conv.messages)
