"""LangGraph through agentrt: a ToolNode graph with InMemorySaver over 2 threads x 4 turns (tool
calls run, KV reuse from turn 2 on, streamed chunks = non-streamed calls), a rejected call in
invalid_tool_calls, and agent nodes handing off with Command.

Each runs twice: on scripted replies (tests/scripted_model.py: what a good model writes; the
graph, ChatAgentrt, engine and grammar are checked), and on the embedded SmolLM2, where whether
the 135M model calls the right tool with the right city is `model_quality`."""

from __future__ import annotations

import json

import anyio
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool as lc_tool

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool
from agentrt.integrations.langgraph import ChatAgentrt, agent_node
from agentrt.toolcall.formats import HERMES
from tests.scripted_model import last_user, scripted

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

RAN: list[tuple] = []
SYSTEM = ("You are the travel desk assistant of a small agency. You answer questions about the weather "
          "in cities our customers travel to. Always look the weather up with the get_weather tool "
          "before answering; never guess. Answer in one short sentence with the temperature in "
          "celsius and the sky. If a city is unknown, say so politely. Keep answers friendly.")
CITIES = ["Paris", "Tokyo", "Lima", "Oslo"]


def reply(prompt: str) -> str | None:
    """What a good model writes in these tests."""
    asked = last_user(prompt)
    if asked.startswith("<tool_response>"):  # (SmolLM2's template: a tool result is a user turn)
        return "Done: " + asked.split("\n")[1]
    if "front desk" in prompt:
        return HERMES.render_calls([("transfer_to_math", {"task": asked})])
    numbers = [int(w) for w in asked.rstrip("?").split() if w.isdigit()]
    if "calculator" in prompt and len(numbers) == 2:
        return HERMES.render_calls([("add", {"a": numbers[0], "b": numbers[1]})])
    if "forecast" in asked:  # (the validator test: a tool that was not given)
        return HERMES.render_calls([("get_forecast", {"city": asked.rstrip("?").split()[-1]})])
    city = asked.split(" in ")[-1].split()[0] if " in " in asked else None
    return HERMES.render_calls([("get_weather", {"city": city})]) if city else None


@pytest.fixture(params=["scripted", pytest.param("embedded", marks=pytest.mark.model_quality)])
def lm(request):
    return scripted(reply) if request.param == "scripted" else request.getfixturevalue("embedded")


@lc_tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city name, e.g. "Paris"
    """
    RAN.append(city)
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


@lc_tool
def get_time(city: str) -> str:
    """Local time in a city.

    Args:
        city: the city name
    """
    return "12:00"


def build_graph(model):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    call = model.bind_tools([get_weather, get_time], tool_choice="required", parallel_tool_calls=False)
    answer = model.bind_tools([get_weather, get_time], tool_choice="none")

    async def agent(state):
        m = answer if isinstance(state["messages"][-1], ToolMessage) else call
        return {"messages": [await m.ainvoke([SystemMessage(SYSTEM)] + state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([get_weather, get_time]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


def test_toolnode_graph_two_threads_four_turns(lm):
    RAN.clear()

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as eng:
            model = ChatAgentrt(engine=eng, max_tokens=40)
            app = build_graph(model)
            invoked, streamed = [], []
            for city in CITIES:
                q = {"messages": [HumanMessage(f"What is the weather in {city} today?")]}
                out = await app.ainvoke(q, {"configurable": {"thread_id": "invoke"}})
                invoked.append(out["messages"])
                chunks = {}
                async for chunk, meta in app.astream(q, {"configurable": {"thread_id": "stream"}},
                                                     stream_mode="messages"):
                    if isinstance(chunk, AIMessageChunk):
                        chunks[chunk.id] = chunks[chunk.id] + chunk if chunk.id in chunks else chunk
                streamed.append(list(chunks.values()))
            return invoked, streamed, set(model.sessions)
    invoked, streamed, keys = anyio.run(main)
    assert keys == {"invoke/agent", "stream/agent"}
    assert RAN == [c for city in CITIES for c in (city, city)]  # every call reached ToolNode and ran
    for turn, (msgs, chunks) in enumerate(zip(invoked, streamed)):
        new = msgs[-4:]  # human, AI call, tool result, AI answer
        assert isinstance(new[1], AIMessage) and isinstance(new[2], ToolMessage) and isinstance(new[3], AIMessage)
        assert new[1].tool_calls[0]["name"] == "get_weather"
        assert new[1].tool_calls[0]["args"] == {"city": CITIES[turn]}
        # streamed == invoked (ids hash the prompt; the other thread's tokens may split the same text differently)
        assert [_calls(c) for c in chunks] == [_calls(new[1]), _calls(new[3])]
        assert all(tc["id"].startswith("call_") for c in chunks for tc in c.tool_calls)
        for ai in (new[1], new[3]):
            u = ai.usage_metadata
            assert u["input_tokens"] > 0
            if turn > 0 and ai is new[1]:
                assert u["input_token_details"]["cache_read"] >= 0.9 * u["input_tokens"], (turn, u)
        # the answer reuses the call's prompt and reply, but the reply's forced tail: fast-forward
        # ended the call with `"}}</tool_call>` + end-of-turn in one step, before they were fed
        call, answer = new[1].usage_metadata, new[3].usage_metadata
        assert answer["input_token_details"]["cache_read"] >= call["input_tokens"] + call["output_tokens"] - 12


def _calls(msg) -> list:
    return [(c["name"], c["args"]) for c in msg.tool_calls]


def test_a_call_the_validator_rejects_is_an_invalid_tool_call(lm):
    """Steered by two examples in the history, the unconstrained model calls a tool it was not given."""
    history = [SystemMessage(SYSTEM)]
    for i, (city, sky) in enumerate((("Rome", "sunny"), ("Madrid", "rain"))):
        history += [HumanMessage(f"What is the forecast for {city}?"),
                    AIMessage("", tool_calls=[{"name": "get_forecast", "args": {"city": city}, "id": f"c{i}"}]),
                    ToolMessage(json.dumps({"city": city, "forecast": sky}), tool_call_id=f"c{i}"),
                    AIMessage(f"{city}: {sky}.")]
    history.append(HumanMessage("What is the forecast for Berlin?"))

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as eng:
            model = ChatAgentrt(engine=eng, max_tokens=40, constrained=False).bind_tools([get_weather])
            return await model.ainvoke(history)
    msg = anyio.run(main)
    assert not msg.tool_calls
    [bad] = msg.invalid_tool_calls
    assert bad["name"] == "get_forecast" and "get_forecast" in bad["error"]


CALC: list[tuple] = []


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    CALC.append((a, b))
    return a + b


def test_agent_nodes_hand_off_and_keep_their_sessions(lm):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    CALC.clear()

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as eng, Runtime(eng) as rt:
            desk = Agent("desk", "You are the front desk. Hand every question to the math agent.",
                         tool_choice="required", settings=SamplingParams(max_tokens=48), max_tool_rounds=1)
            math = Agent("math", "You are a calculator. Use the add tool, then state the result.", [add],
                         tool_choice="required", settings=SamplingParams(max_tokens=48), max_tool_rounds=1)
            desk_node = agent_node(desk, rt, handoffs=["math"])
            math_node = agent_node(math, rt)
            g = StateGraph(MessagesState)
            g.add_node("desk", desk_node, destinations=("math",))
            g.add_node("math", math_node)
            g.add_edge(START, "desk")
            app = g.compile(checkpointer=InMemorySaver())
            sessions, usage = [], []
            for q in ("What is 2 plus 3?", "And what is 10 plus 20?"):
                out = await app.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": "h"}})
                agents = {n: rt.actors[f"{n}/h"].behavior for n in ("desk", "math")}
                sessions.append({n: a.session for n, a in agents.items()})
                usage.append({n: b.last_result["h"].usage[0] for n, b in
                              (("desk", desk_node.binding), ("math", math_node.binding))})
            return out["messages"], sessions, usage
    messages, sessions, usage = anyio.run(main)
    assert len(CALC) == 2  # the math agent's tool ran on both turns
    names = [m.name for m in messages if isinstance(m, AIMessage)]
    assert names.count("desk") >= 2 and names.count("math") >= 4
    handoffs = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls if c["name"] == "transfer_to_math"]
    assert len(handoffs) == 2
    assert sessions[0]["desk"] is sessions[1]["desk"] and sessions[0]["math"] is sessions[1]["math"]
    for n in ("desk", "math"):  # turn 2 of each agent reuses the KV of its turn 1
        u = usage[1][n]
        assert u.cached_tokens >= 0.6 * u.prompt_tokens, (n, u)
