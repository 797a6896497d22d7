"""ChatAgentrt on a tiny random model with SmolLM2's tokenizer (fast): session routing and the
ledger, delta-only prefill, outputs equal to the naive oracle, streaming vs non-streaming,
rejected calls, structured output, sync and cross-loop paths, release policy, and LangGraph
graphs (Send fan-out)."""

from __future__ import annotations

import json
import operator
from typing import Annotated

import anyio
import pydantic
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool as lc_tool
from typing_extensions import TypedDict

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import ConfigError
from agentrt.integrations.langgraph import ChatAgentrt, SessionPolicy, session_key
from agentrt.integrations.langgraph.host import EngineHost
from agentrt.integrations.langgraph.messages import tools_to_openai
from agentrt.integrations.langgraph.stream import Chunker
from agentrt.model.generate import generate
from agentrt.toolcall import ToolCallParser
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

CFG = EngineConfig(kv_cache_tokens=8192, response_cache_size=0, debug_invariants=True)


@lc_tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city name
    """
    return json.dumps({"city": city, "sky": "cloudy"})


def run(fn):
    """Run fn(model, engine) inside an engine on the tiny model; check nothing leaked."""
    lm = tiny_model_with_tokenizer()

    async def main():
        async with Engine(lm, CFG) as eng:
            model = ChatAgentrt(engine=eng, max_tokens=8)
            out = await fn(model, eng)
            await model.arelease()
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            return out
    return anyio.run(main)


def history(n: int) -> list:
    msgs = [SystemMessage("You are terse."), HumanMessage("hello there")]
    for i in range(n):
        msgs += [AIMessage(f"answer {i}"), HumanMessage(f"question number {i}")]
    return msgs


def test_session_key_from_run_config():
    conf = {"configurable": {"thread_id": "t1", "checkpoint_ns": "agent:1f0e|tools:9ab2"},
            "metadata": {"langgraph_path": ("__pregel_push", 3, False)}}
    assert session_key(conf) == "t1/agent|tools#3"
    assert session_key({"configurable": {"thread_id": "t1", "checkpoint_ns": "agent:x"}}) == "t1/agent"
    assert session_key({"configurable": {"agentrt_session": "mine", "thread_id": "t"}}) == "mine"
    assert session_key({}) is None and session_key(None) is None


def test_tools_from_every_langchain_form():
    class Lookup(pydantic.BaseModel):
        """Look a word up."""
        word: str

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first
            b: second
        """
        return a + b
    raw = {"type": "function", "function": {"name": "ping", "description": "p",
                                            "parameters": {"type": "object", "properties": {}}}}
    specs = tools_to_openai([get_weather, Lookup, add, raw])
    assert [s["function"]["name"] for s in specs] == ["get_weather", "Lookup", "add", "ping"]
    assert specs[2]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    # the same tool twice (also a pydantic class and its JSON schema: titles differ) is bound once
    assert tools_to_openai([get_weather, get_weather]) == tools_to_openai([get_weather])
    assert tools_to_openai([Lookup, Lookup.model_json_schema()]) == tools_to_openai([Lookup])
    other = {"type": "function", "function": {"name": "ping", "description": "p", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}}
    with pytest.raises(ConfigError, match="unique"):
        tools_to_openai([raw, other])  # two different tools named "ping"
    with pytest.raises(ConfigError, match="list of tools"):
        tools_to_openai(get_weather)


def test_agentrts_own_tools_bind_as_they_run():
    """The README's `@tool` function (agentrt.tool), a Toolset, and a Tool beside LangChain's
    forms: each binds with the schema agentrt derived for it (issue 57: a Tool was refused)."""
    from agentrt import Toolset, tool

    @tool
    def weather(city: str, unit: str = "celsius") -> dict:
        """Current weather in a city.

        Args:
            city: the city
            unit: celsius or fahrenheit
        """
        return {"city": city}

    [spec] = tools_to_openai([weather])
    assert spec == weather.openai_schema()
    assert spec["function"]["parameters"]["properties"]["city"]["description"] == "the city"
    assert tools_to_openai(Toolset([weather])) == [spec]
    assert [s["function"]["name"] for s in tools_to_openai([weather, get_weather])] == ["weather", "get_weather"]
    assert tools_to_openai([weather], strict=True)[0]["function"]["strict"] is True

    async def fn(model, eng):
        m = model.bind_tools([weather], tool_choice="required", parallel_tool_calls=False)
        return await m.ainvoke([HumanMessage("weather in Paris?")], max_tokens=48)
    out = run(fn)
    assert [c["name"] for c in out.tool_calls + out.invalid_tool_calls] == ["weather"]


def test_second_call_prefills_only_the_delta_and_matches_the_oracle():
    lm = tiny_model_with_tokenizer()

    async def fn(model, eng):
        first = await model.ainvoke(history(1), session="s")
        held = len(model.sessions["s"].session.tokens)  # what the session's KV covers
        msgs = history(1) + [first, HumanMessage("and one more thing")]
        second = await model.ainvoke(msgs, session="s")
        return first, second, held, list(model.sessions["s"].conversation.tokens)
    first, second, held, tokens = run(fn)
    u = second.usage_metadata
    assert u["input_token_details"]["cache_read"] == held
    assert u["input_tokens"] - u["input_token_details"]["cache_read"] <= 20  # only the new message
    # the session's tokens are prompt + output; the output is what naive decoding gives
    n_out = second.usage_metadata["output_tokens"]
    prompt = tokens[:u["input_tokens"]]
    ref = generate(lm.model, prompt, SamplingParams(max_tokens=8), eos_token_ids=lm.tokenizer.eos_token_ids)
    assert tokens[u["input_tokens"]:u["input_tokens"] + n_out] == ref[:n_out]


def test_edited_history_rolls_back_and_equals_a_fresh_call():
    async def fn(model, eng):
        await model.ainvoke(history(2), session="s")
        edited = history(2)
        edited[1] = HumanMessage("a different opening question")
        in_session = await model.ainvoke(edited, session="s")
        fresh = await model.ainvoke(edited)  # transient: no session
        return in_session, fresh
    in_session, fresh = run(fn)
    assert in_session.content == fresh.content
    assert in_session.usage_metadata["input_tokens"] == fresh.usage_metadata["input_tokens"]


def test_streamed_chunks_assemble_into_the_non_streamed_calls():
    async def fn(model, eng):
        m = model.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
        msgs = [HumanMessage("weather in Paris?")]
        whole = await m.ainvoke(msgs, max_tokens=40)
        total = None
        async for c in m.astream(msgs, max_tokens=40):
            total = c if total is None else total + c
        return whole, total
    whole, total = run(fn)
    assert whole.tool_calls or whole.invalid_tool_calls
    assert total.tool_calls == whole.tool_calls
    assert [c["id"] for c in total.invalid_tool_calls] == [c["id"] for c in whole.invalid_tool_calls]
    for c in whole.tool_calls:
        assert c["name"] == "get_weather" and c["id"].startswith("call_")


def _stream_text(text: str):
    """The validator's verdicts on text streamed in 7-character pieces, as the message
    _agenerate builds from the chunks."""
    from agentrt.integrations.langgraph.stream import aggregate

    parser = ToolCallParser(tools_to_openai([get_weather]), wrapper="hermes")
    chunks, chunker = [], Chunker("call_x")
    events = [ev for i in range(0, len(text), 7) for ev in parser.feed(text[i:i + 7])] + parser.close()
    chunks += [c for c in map(chunker, events) if c is not None]
    return chunks, aggregate(chunks).generations[0].message


def test_rejected_calls_are_invalid_tool_calls_not_exceptions():
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>\n'
    chunks, msg = _stream_text(good + '<tool_call>{"name": "get_forecast", "arguments": {"city": "Oslo"}}</tool_call>')
    assert msg.tool_calls == [{"name": "get_weather", "args": {"city": "Rome"}, "id": "call_x_0", "type": "tool_call"}]
    [bad] = msg.invalid_tool_calls
    assert bad["id"] == "call_x_1" and bad["name"] == "get_forecast" and "get_forecast" in bad["error"]
    streamed = chunks[0].message
    for c in chunks[1:]:
        streamed = streamed + c.message
    assert streamed.tool_calls == msg.tool_calls  # the stream's merge agrees: the call is not runnable
    assert [c["id"] for c in streamed.invalid_tool_calls] == ["call_x_1"]

    _, msg = _stream_text('<tool_call>{"name": "get_weather", "arguments": {"town": "Oslo"}}</tool_call>')
    [bad] = msg.invalid_tool_calls
    assert not msg.tool_calls and bad["args"].startswith('{"name": "get_weather"') and "city" in bad["error"]
    _, msg = _stream_text('<tool_call>{"name": "get_weather", "arguments": {"city": Oslo}}</tool_call>')
    assert not msg.tool_calls and len(msg.invalid_tool_calls) == 1  # malformed JSON


def test_structured_output_follows_the_schema():
    class Forecast(pydantic.BaseModel):
        city: str = pydantic.Field(json_schema_extra={"enum": ["Paris", "Lima"]})
        days: int = pydantic.Field(ge=1, le=9)

    async def fn(model, eng):
        model.max_tokens = 64
        out = await model.with_structured_output(Forecast).ainvoke([HumanMessage("forecast?")])
        raw = await model.with_structured_output(Forecast, include_raw=True).ainvoke([HumanMessage("x")])
        return out, raw
    out, raw = run(fn)
    assert isinstance(out, Forecast) and out.city in ("Paris", "Lima") and 1 <= out.days <= 9
    assert set(raw) == {"raw", "parsed", "parsing_error"}, raw
    assert isinstance(raw["parsed"], Forecast), raw


def test_bad_input_raises_typed_errors():
    async def fn(model, eng):
        with pytest.raises(ConfigError, match="needs tools"):
            await model.ainvoke("hi", tool_choice="required")
        with pytest.raises(ConfigError, match="unsupported call arguments"):
            await model.ainvoke("hi", frequency_penalty=1.0)
        with pytest.raises(ConfigError, match="names no bound tool"):
            model.bind_tools([get_weather], tool_choice="nope")
        with pytest.raises(ConfigError):
            await model.ainvoke("hi", max_tokens=0)
    run(fn)
    with pytest.raises(ConfigError, match="engine="):
        ChatAgentrt()
    with pytest.raises(ConfigError, match="max_sessions"):
        SessionPolicy(max_sessions=0)


def test_release_policy_closes_least_recently_used_sessions():
    async def fn(model, eng):
        model._shared.router.policy = SessionPolicy(max_sessions=2)
        for key in ("a", "b", "c"):
            await model.ainvoke(history(0), session=key)
        keys = set(model.sessions)
        assert eng.stats().sessions == 2
        return keys
    assert run(fn) == {"b", "c"}


def test_sync_and_cross_loop_calls_through_an_owned_engine():
    lm = tiny_model_with_tokenizer()
    host = EngineHost.start(lambda: Engine(lm, CFG))
    model = ChatAgentrt(host=host, max_tokens=6)
    try:
        sync = model.invoke(history(0), session="x")
        chunks = list(model.stream(history(0)))
        other_loop = anyio.run(lambda: model.ainvoke(history(0)))
        assert "".join(c.content for c in chunks) == sync.content == other_loop.content
        assert chunks[-1].usage_metadata["input_tokens"] == sync.usage_metadata["input_tokens"]
    finally:
        model.close()
    assert host.engine.closed


class FanState(TypedDict):
    topics: list[str]
    answers: Annotated[list, operator.add]


def test_langgraph_send_fan_out_gets_one_session_per_push_index():
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from langgraph.types import Send

    async def fn(model, eng):
        async def worker(arg):
            r = await model.ainvoke([HumanMessage(f"tell me about {arg}")])
            return {"answers": [r.usage_metadata["input_token_details"]["cache_read"]]}

        g = StateGraph(FanState)
        g.add_node("worker", worker)
        g.add_conditional_edges(START, lambda s: [Send("worker", t) for t in s["topics"]], ["worker"])
        app = g.compile(checkpointer=InMemorySaver())
        cfg = {"configurable": {"thread_id": "fan"}}
        await app.ainvoke({"topics": ["cats", "dogs", "owls"]}, cfg)
        second = await app.ainvoke({"topics": ["cats", "dogs", "owls"]}, cfg)
        return set(model.sessions), second["answers"][-3:]
    keys, cache_reads = run(fn)
    assert keys == {"fan/worker#0", "fan/worker#1", "fan/worker#2"}
    assert all(c > 0 for c in cache_reads)  # the same prompt again: served from each session


def test_agent_task_in_the_functional_api_keeps_one_session_per_thread():
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.func import entrypoint

    from agentrt import Agent, Runtime
    from agentrt.integrations.langgraph import agent_task

    async def fn(model, eng):
        async with Runtime(eng) as rt:
            helper = agent_task(Agent("helper", "You help.", settings=SamplingParams(max_tokens=4)), rt)

            @entrypoint(checkpointer=InMemorySaver())
            async def workflow(question: str, *, previous: list | None = None):
                history = (previous or []) + [HumanMessage(question, id=f"q{len(previous or [])}")]
                new = await helper(history)
                return entrypoint.final(value=new[-1].content, save=history + new)

            cfg = {"configurable": {"thread_id": "f"}}
            await workflow.ainvoke("first question", cfg)
            await workflow.ainvoke("second question", cfg)
            agent = rt.actors["helper/f"].behavior
            usage = helper.binding.last_result["f"].usage[0]
            n_user = sum(m["role"] == "user" for m in agent.messages)
            await rt.stop_all()
            return usage, n_user
    usage, n_user = run(fn)
    assert n_user == 2  # the second turn gave the agent only the new question
    # and prefilled only that delta: the last answer token, the turn end, the question, the prompt
    assert 0 < usage.prompt_tokens - usage.cached_tokens <= 16, usage
