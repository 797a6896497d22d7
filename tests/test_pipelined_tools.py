"""Pipelined tool execution: a call of a `pure` tool starts the moment it validates, while the
model still writes the next call; other tools start when the round ends; results come back in
call order. The model's output is scripted (a stand-in engine streams fixed text token by token
through the real tokenizer, chat format and parser); the real-model figure is measured by
`bench/bench_agents.py --tool-latency`."""

from __future__ import annotations

import types
from typing import Literal

import anyio
import pytest

from agentrt import Agent, EngineConfig, Runtime, tool
from agentrt.conversation.chat_format import ChatFormat
from agentrt.conversation.engine_text import chat_format_of
from agentrt.engine.shared import EngineShared
from agentrt.records.request import TokenEvent, Usage
from agentrt.toolcall.formats import HERMES
from tests.conftest import smol_tokenizer


class ScriptedEngine:
    """The engine interface an Agent uses (agentrt.EngineLike), answering each round with the next
    scripted text."""

    state_store = None  # (no durable state: agentrt/runtime/persist.py)
    model = types.SimpleNamespace(cfg=None)  # (no model: nothing reads its config here)
    model_name = None
    closed, alive = False, True
    portal = loop_thread_id = None

    def __init__(self, replies: list[str], tokenizer=None) -> None:
        self.tokenizer = tokenizer or smol_tokenizer()
        self.shared = EngineShared(chat_format=ChatFormat(self.tokenizer))  # (conversation/engine_text.py reads it)
        self.replies = list(replies)
        self.stopped: list[int] = []
        self._thread = "running"  # (Runtime checks the engine was entered)
        self.max_context_tokens = 1 << 20
        self.started = True
        self.config = EngineConfig()  # (what the session leases and the rounds read)

    async def __aenter__(self) -> ScriptedEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        return None

    async def open_session(self, tag=None, cache_salt=None, timeout=None, adapter=None, key=None):
        return _Session()

    def stop(self, request_id: int) -> None:
        self.stopped.append(request_id)

    def declare_workflow(self, workflow) -> None:
        return None

    async def generate(self, prompt, params, *, session=None, constraint=None, **request):
        ids = self.tokenizer.encode(self.replies.pop(0)) + [self.tokenizer.eos_token_ids[0]]
        for tok in ids:
            await anyio.sleep(0.001)  # a decode step: other tasks run
            yield TokenEvent(1, (tok,))
        yield TokenEvent(1, (), "stop", Usage(len(prompt), 0, len(prompt), len(ids)))


class _Session:
    closed = False

    async def expect_tools(self, tools) -> float:
        return 0.0

    async def close(self) -> None:
        self.closed = True


def test_pure_calls_start_before_the_round_ends():
    seen: dict[str, str] = {}
    holder: dict = {}

    def round_state() -> str:
        return holder["agent"].conversation.messages[-1]["role"]  # "assistant" once the round closed

    @tool(pure=True)
    async def lookup(key: Literal["alpha", "beta"]) -> str:
        seen[f"lookup {key}"] = round_state()
        await anyio.sleep(0.01)
        return f"{key}=1"

    @tool
    async def write(key: Literal["alpha", "beta"]) -> str:
        seen[f"write {key}"] = round_state()
        return "written"

    calls = [("lookup", {"key": "alpha"}), ("write", {"key": "beta"}), ("lookup", {"key": "beta"})]
    engine = ScriptedEngine([HERMES.render_calls(calls), "Done."])
    agent = holder["agent"] = Agent("a", "Use tools.", [lookup, write], engine=engine, constrained=False)

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            return await ref.ask("go")

    result = anyio.run(main)
    # the pure calls ran while the model was still writing; the other one after the round closed
    assert seen == {"lookup alpha": "user", "lookup beta": "user", "write beta": "assistant"}
    assert [r.content for r in result.tool_results] == ["alpha=1", "written", "beta=1"]  # call order
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    ids = [c["id"] for c in result.messages[0]["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_msgs] == ids and result.text == "Done."


def test_an_early_stop_keeps_the_reply_up_to_the_stop_and_closes_the_tag():
    """parallel_tool_calls=False: the parser stops at the call's last '}'; what the engine sent after
    it is dropped (the reply never depends on timing) and the open tag is closed."""
    @tool
    def lookup(key: Literal["alpha", "beta"]) -> str:
        return "1"

    engine = ScriptedEngine([HERMES.render_calls([("lookup", {"key": "alpha"})]) + "\ntrailing junk", "Done."])
    agent = Agent("a", "", [lookup], engine=engine, constrained=False, parallel_tool_calls=False)

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            await ref.ask("go")

    anyio.run(main)
    text = engine.tokenizer.decode(agent.tokens)
    assert '{"key": "alpha"}}</tool_call><|im_end|>' in text and "junk" not in text and engine.stopped


def test_an_engine_error_reaches_the_caller_unwrapped():
    from agentrt.errors import EngineClosed

    class Closed(ScriptedEngine):
        async def generate(self, *args, **kwargs):
            raise EngineClosed("the engine is closed")
            yield  # pragma: no cover

    @tool(pure=True)
    def lookup(key: Literal["alpha"]) -> str:
        return "1"

    engine = Closed([])
    agent = Agent("a", "", [lookup], engine=engine, constrained=False)

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            with pytest.raises(EngineClosed):  # not an ExceptionGroup from the round's task group
                await ref.ask("go")

    anyio.run(main)


@pytest.mark.parametrize("reply", ['{"name": "lookup", "arguments": {"key": "alpha"}}',
                                   'Sure.\n<tool_call>{"name": "lookup", "arguments": {"key": "alpha"}}</tool_call>',
                                   '```json\n{"name": "lookup", "arguments": {"key": "alpha"}}\n```'])
def test_auto_runs_bare_tagged_and_fenced_calls(reply):
    """tool_choice auto, unconstrained: the way small instruct models write calls all run the tool."""
    @tool
    def lookup(key: Literal["alpha", "beta"]) -> str:
        return f"{key}=1"

    engine = ScriptedEngine([reply, "alpha is 1."])
    agent = Agent("a", "", [lookup], engine=engine, constrained=False)

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            return await ref.ask("What is alpha?")

    result = anyio.run(main)
    assert [r.content for r in result.tool_results] == ["alpha=1"] and result.text == "alpha is 1."


def test_two_calls_in_one_round_on_the_qwen_template(tmp_path):
    """Qwen2.5 merges the two results into one user turn: the turn goes on (it used to raise
    ChatTemplateError) and the next round's prompt is the template's rendering."""
    from agentrt.toolcall.formats import QWEN
    from tests.qwen_fixture import qwen_tokenizer

    @tool
    def lookup(key: Literal["alpha", "beta"]) -> str:
        return f"{key}=1"

    engine = ScriptedEngine([QWEN.render_calls([("lookup", {"key": "alpha"}), ("lookup", {"key": "beta"})]),
                             "Both are 1."], tokenizer=qwen_tokenizer(tmp_path))
    agent = Agent("a", "Use tools.", [lookup], engine=engine, constrained=False)
    prompts = []

    async def main():
        async with Runtime(engine) as rt:
            ref = await rt.spawn(agent, name="a")
            async for ev in ref.ask_stream("alpha and beta?"):
                if type(ev).__name__ == "RoundStarted":
                    prompts.append((list(agent.tokens), [dict(m) for m in agent.messages]))
                result = ev
            return result

    result = anyio.run(main)
    assert [r.content for r in result.tool_results] == ["alpha=1", "beta=1"] and result.text == "Both are 1."
    tokens, messages = prompts[1]
    assert chat_format_of(engine).tool_format.name == "qwen"
    rendered = chat_format_of(engine).render(messages, [lookup.openai_schema()])
    assert engine.tokenizer.decode(tokens) == rendered and rendered.count("<tool_response>") == 2
