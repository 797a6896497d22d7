"""LangChain v1's agent (`langchain.agents.create_agent`) on ChatAgentrt.

On the tiny random model (fast): the agent binds its tools, a middleware's tool_choice reaches the
grammar, tool calls round-trip through ToolMessages, each thread keeps its KV session across
model calls and turns, the sync and streaming paths, ProviderStrategy structured output, and
middlewares that edit the history between turns (a request-only rewrite, a state rewrite, LangChain's
SummarizationMiddleware) give the same calls and text as a run whose session was released first.
A calculator agent (a named and a "required" tool_choice, the answer) and an edited-history turn
equal to one without session reuse: on scripted replies (tests/scripted_model.py), and on the
embedded SmolLM2, where the 135M model's arguments and answers are `model_quality`.

Comparing runs: a call id is a hash of the call's prompt tokens, so equal ids mean equal prompts.
The edits compared here leave no model reply inside the reused prefix. (A session keeps each reply
as the tokens the model generated; a fresh run re-tokenizes the reply's text, which for a
grammar-constrained call or a random model's text is often a different token sequence, so an edit
*after* a reply legitimately prompts differently with and without reuse.) parallel_tool_calls stays
True: with False the round is stopped at the call's last '}' and how many more tokens the engine
produced before the stop is a race, which the session then keeps.
"""

from __future__ import annotations

from typing import Literal

import anyio
import pydantic
import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, SummarizationMiddleware, before_model
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool as lc_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import PrivateAttr

from agentrt import Engine, EngineConfig
from agentrt.integrations.langgraph import ChatAgentrt
from agentrt.integrations.langgraph.host import EngineHost
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

CFG = EngineConfig(kv_cache_tokens=16384, response_cache_size=0, debug_invariants=True)
SYSTEM = "You report the weather."
CITY = Literal["Paris", "Tokyo", "Lima"]


@lc_tool
def get_weather(city: CITY) -> str:
    """Current weather for a city.

    Args:
        city: the city name
    """
    return f"sunny in {city}"


@lc_tool
def get_time(city: CITY) -> str:
    """Local time in a city.

    Args:
        city: the city name
    """
    return f"12:00 in {city}"


class Recording(ChatAgentrt):
    """ChatAgentrt that records what each call was given."""

    _calls: list = PrivateAttr(default_factory=list)

    def _spec(self, messages, stop, kwargs):
        spec = super()._spec(messages, stop, kwargs)
        self._calls.append({"tools": [t["function"]["name"] for t in spec.tools or ()], "tool_choice": spec.tool_choice,
                            "key": spec.key, "roles": [m["role"] for m in spec.messages], "stop": tuple(spec.stop)})
        return spec


class ToolThenAnswer(AgentMiddleware):
    """A question -> tool_choice `first`; a tool result -> tool_choice "none" with `answer` settings."""

    def __init__(self, first: str = "get_weather", **answer) -> None:
        super().__init__()
        self.first, self.answer = first, answer or {"max_tokens": 8}

    def _choose(self, request):
        if isinstance(request.messages[-1], ToolMessage):
            return request.override(tool_choice="none", model_settings=self.answer)
        return request.override(tool_choice=self.first)

    def wrap_model_call(self, request, handler):
        return handler(self._choose(request))

    async def awrap_model_call(self, request, handler):
        return await handler(self._choose(request))


class DropEarlierToolTraffic(AgentMiddleware):
    """Request-only edit: earlier questions' tool calls and results are not shown to the model."""

    async def awrap_model_call(self, request, handler):
        msgs = request.messages
        last = max(i for i, m in enumerate(msgs) if isinstance(m, HumanMessage))
        kept = [m for i, m in enumerate(msgs)
                if i >= last or not (isinstance(m, ToolMessage) or (isinstance(m, AIMessage) and m.tool_calls))]
        return await handler(request.override(messages=kept))


@before_model
def redact_first_question(state, runtime):
    """State edit: the thread's first question is rewritten in place (same id) on a later turn."""
    first = state["messages"][0]
    if len(state["messages"]) > 4 and first.content != "[redacted]":
        return {"messages": [HumanMessage("[redacted]", id=first.id)]}
    return None


EDITS = {
    "drop_earlier_tool_traffic": lambda model: [DropEarlierToolTraffic()],
    "redact_first_question": lambda model: [redact_first_question],
    # the agent's own model writes the summary (its own session: key "<thread>/SummarizationMiddleware.before_model")
    "summarize": lambda model: [SummarizationMiddleware(model, trigger=("messages", 5), keep=("messages", 1))],
}


def run(fn):
    """fn(engine) inside an engine on the tiny model; nothing may leak."""
    async def main():
        async with Engine(tiny_model_with_tokenizer(), CFG) as eng:
            out = await fn(eng)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            return out
    return anyio.run(main)


def cache_read(m: AIMessage) -> int:
    return m.usage_metadata["input_token_details"]["cache_read"]


def held_after(m: AIMessage) -> int:
    """Tokens the call's session holds in KV afterwards: its prompt and output (the last
    sampled token is never fed back)."""
    return m.usage_metadata["input_tokens"] + m.usage_metadata["output_tokens"] - 1


def view(messages) -> list[tuple]:
    """What must be equal between two runs: every message's text, its calls (ids included: they
    hash the prompt tokens) and the call's token counts."""
    out = []
    for m in messages:
        calls = [(c["name"], c["args"], c["id"]) for c in getattr(m, "tool_calls", None) or ()]
        u = getattr(m, "usage_metadata", None) or {}
        out.append((m.type, m.content, calls, getattr(m, "tool_call_id", None), u.get("input_tokens"),
                    u.get("output_tokens")))
    return out


@pytest.mark.parametrize("choice, enforced", [("get_weather", "get_weather"), ("any", "required")])
def test_agent_binds_tools_passes_tool_choice_and_reuses_the_thread_session(choice, enforced):
    async def fn(eng):
        model = Recording(engine=eng, max_tokens=96)
        agent = create_agent(model, tools=[get_weather, get_time], system_prompt=SYSTEM,
                             middleware=[ToolThenAnswer(choice)], checkpointer=InMemorySaver())
        cfg = {"configurable": {"thread_id": "t"}}
        first = (await agent.ainvoke({"messages": [HumanMessage("weather in Paris?")]}, cfg))["messages"]
        both = (await agent.ainvoke({"messages": [HumanMessage("and in Lima?")]}, cfg))["messages"]
        calls = list(model._calls)
        assert set(model.sessions) == {"t/model"}
        await model.arelease()
        return first, both[len(first):], calls
    first, second, calls = run(fn)

    assert len(calls) == 4  # two model calls per turn: the tool call, the answer
    for c in calls:
        assert c["tools"] == ["get_weather", "get_time"] and c["key"] == "t/model"
    assert [c["tool_choice"] for c in calls] == [enforced, "none", enforced, "none"]
    assert calls[0]["roles"] == ["system", "user"]
    assert calls[1]["roles"] == ["system", "user", "assistant", "tool"]
    assert calls[3]["roles"] == ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "tool"]

    for turn in (first, second):
        human, ai, result, answer = turn
        assert isinstance(human, HumanMessage) and isinstance(result, ToolMessage)
        [call] = ai.tool_calls
        assert not ai.invalid_tool_calls and ai.response_metadata["finish_reason"] == "tool_calls"
        if enforced != "required":
            assert call["name"] == enforced
        assert call["args"]["city"] in ("Paris", "Tokyo", "Lima")
        tool = {"get_weather": get_weather, "get_time": get_time}[call["name"]]
        assert result.tool_call_id == call["id"] and result.name == call["name"]
        assert result.content == tool.invoke(call["args"])
        assert isinstance(answer, AIMessage) and not answer.tool_calls and answer.content
        assert answer.response_metadata["agentrt_session"] == "t/model"
        # the answer's prompt: the call's prompt already held (a grammar-shaped call is re-tokenized
        # the tokenizer's way, so its ids from the first odd split on are recomputed)
        assert cache_read(answer) >= ai.usage_metadata["input_tokens"]
    assert cache_read(second[1]) >= held_after(first[3])  # turn 2 starts from all of turn 1


def test_sync_invoke_and_message_stream_through_an_owned_engine():
    host = EngineHost.start(lambda: Engine(tiny_model_with_tokenizer(), CFG))
    model = ChatAgentrt(host=host, max_tokens=96)
    try:
        agent = create_agent(model, tools=[get_weather], system_prompt=SYSTEM,
                             middleware=[ToolThenAnswer()], checkpointer=InMemorySaver())
        out = agent.invoke({"messages": [HumanMessage("weather in Tokyo?")]}, {"configurable": {"thread_id": "a"}})
        chunks = [(c, meta) for c, meta in agent.stream({"messages": [HumanMessage("weather in Tokyo?")]},
                                                         {"configurable": {"thread_id": "b"}}, stream_mode="messages")
                  if isinstance(c, AIMessageChunk)]
    finally:
        model.close()
    assert host.engine.closed
    _, ai, result, answer = out["messages"]
    assert ai.tool_calls[0]["name"] == "get_weather" and result.content == get_weather.invoke(ai.tool_calls[0]["args"])
    assert all(meta["langgraph_node"] == "model" for _, meta in chunks)
    streamed = [tc for c, _ in chunks for tc in c.tool_call_chunks]
    assert [(tc["name"], tc["id"]) for tc in streamed] == [("get_weather", ai.tool_calls[0]["id"])]
    assert "".join(c.content for c, _ in chunks) == answer.content  # the same prompts as thread a


def test_profile_and_provider_strategy_structured_output():
    class Report(pydantic.BaseModel):
        """A weather report."""
        city: Literal["Paris", "Lima"]
        sunny: bool

    async def fn(eng):
        model = ChatAgentrt(engine=eng, max_tokens=64)
        assert model.profile["tool_calling"] and not model.profile["structured_output"]
        assert model.profile["max_input_tokens"] == 8192  # the tiny model's context (< kv_cache_tokens)
        SummarizationMiddleware(model, trigger=("fraction", 0.8))  # needs max_input_tokens
        agent = create_agent(model, tools=[], response_format=ProviderStrategy(Report))
        out = await agent.ainvoke({"messages": [HumanMessage("weather in Paris?")]})
        return out
    out = run(fn)
    assert isinstance(out["structured_response"], Report)
    assert Report.model_validate_json(out["messages"][-1].content) == out["structured_response"]


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_history_edited_between_turns_equals_a_run_without_session_reuse(edit):
    async def fn(eng):
        model = ChatAgentrt(engine=eng, max_tokens=96)
        agent = create_agent(model, tools=[get_weather], system_prompt=SYSTEM,
                             middleware=[ToolThenAnswer(), *EDITS[edit](model)], checkpointer=InMemorySaver())
        runs = {}
        for thread in ("reused", "fresh"):
            cfg = {"configurable": {"thread_id": thread}}
            t1 = (await agent.ainvoke({"messages": [HumanMessage("weather in Paris?")]}, cfg))["messages"]
            if thread == "fresh":  # turn 2 starts without the KV the thread's calls left
                assert await model.arelease(thread) >= 1
            t2 = (await agent.ainvoke({"messages": [HumanMessage("and in Lima?")]}, cfg))["messages"]
            runs[thread] = t1, t2
        await model.arelease()
        return runs
    runs = run(fn)
    (t1, t2), (f1, f2) = runs["reused"], runs["fresh"]
    assert view(t1) == view(f1)
    assert view(t2) == view(f2)
    new = t2[-4:]  # the turn-2 question, call, result, answer
    assert [m.type for m in new] == ["human", "ai", "tool", "ai"] and new[1].tool_calls
    if edit == "redact_first_question":
        assert t2[0].content == "[redacted]"
    elif edit == "summarize":
        assert t2[0].content.startswith("Here is a summary") and len(t2) == 5
    else:
        assert len(t2) == 8  # request-only: the checkpoint keeps the whole history


# ---- the embedded SmolLM2 ------------------------------------------------------------------------------

CALC_SYSTEM = ("You are a helpful assistant. Use the add tool to add numbers. "
               "Then give the user the result in a short sentence.")


@lc_tool
def add(a: int, b: int) -> int:
    """Add two integers and return their sum.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def calculator_reply(prompt: str) -> str:
    """What a good model writes: add on the question's two numbers, then the sum in a sentence."""
    from agentrt.toolcall.formats import HERMES
    from tests.scripted_model import last_user

    asked = last_user(prompt)
    if asked.startswith("<tool_response>"):  # (SmolLM2's template: a tool result is a user turn)
        return f"The sum is {asked.split(chr(10))[1]}."
    a, b = [int(w) for w in asked.rstrip("?").split() if w.isdigit()]
    return HERMES.render_calls([("add", {"a": a, "b": b})])


@pytest.fixture(params=["scripted", pytest.param("embedded", marks=pytest.mark.model_quality)])
def calc_lm(request):
    from tests.scripted_model import scripted

    return scripted(calculator_reply) if request.param == "scripted" else request.getfixturevalue("embedded")


@pytest.mark.embedded
@pytest.mark.slow
def test_calculator_agent_calls_add_and_answers(calc_lm):
    questions = [("What is 17 + 25?", "add", (17, 25)), ("How much is 1200 plus 34?", "any", (1200, 34))]

    async def main():
        async with Engine(calc_lm, EngineConfig(kv_cache_tokens=16384)) as eng:
            model = Recording(engine=eng, max_tokens=48)
            turns = []
            for q, choice, _ in questions:
                agent = create_agent(model, tools=[add], system_prompt=CALC_SYSTEM, checkpointer=saver,
                                     middleware=[ToolThenAnswer(choice, max_tokens=24, stop=["</tool_response>"])])
                before = len((await agent.aget_state(cfg)).values.get("messages", []))
                turns.append((await agent.ainvoke({"messages": [HumanMessage(q)]}, cfg))["messages"][before:])
            calls = list(model._calls)
            await model.arelease()
            return turns, calls
    saver, cfg = InMemorySaver(), {"configurable": {"thread_id": "calc"}}
    turns, calls = anyio.run(main)
    assert [c["tool_choice"] for c in calls] == ["add", "none", "required", "none"]
    assert calls[1]["stop"] == ("</tool_response>",)
    for (q, _, (a, b)), turn in zip(questions, turns):
        _, ai, result, answer = turn
        assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("add", {"a": a, "b": b})], (q, ai)
        assert result.content == str(a + b)
        assert str(a + b) in answer.content, (q, answer.content)
    assert cache_read(turns[1][1]) > 0


@pytest.mark.embedded
@pytest.mark.slow
def test_calculator_edited_history_equals_a_run_without_session_reuse(calc_lm):
    async def main():
        async with Engine(calc_lm, EngineConfig(kv_cache_tokens=16384, response_cache_size=0)) as eng:
            model = ChatAgentrt(engine=eng, max_tokens=48)
            agent = create_agent(model, tools=[add], system_prompt=CALC_SYSTEM, checkpointer=InMemorySaver(),
                                 middleware=[ToolThenAnswer("add", max_tokens=24), DropEarlierToolTraffic()])
            runs = {}
            for thread in ("reused", "fresh"):
                cfg = {"configurable": {"thread_id": thread}}
                t1 = (await agent.ainvoke({"messages": [HumanMessage("What is 17 + 25?")]}, cfg))["messages"]
                if thread == "fresh":
                    await model.arelease(thread)
                t2 = (await agent.ainvoke({"messages": [HumanMessage("And 250 plus 750?")]}, cfg))["messages"]
                runs[thread] = t1, t2
            await model.arelease()
            return runs
    runs = anyio.run(main)
    assert view(runs["reused"][1]) == view(runs["fresh"][1])
    new = runs["reused"][1][-3:]
    assert new[0].tool_calls[0]["args"] == {"a": 250, "b": 750} and "1000" in new[2].content
