"""The examples' programs on scripted replies (tests/scripted_model.py): the engine, agents,
grammar, parser, LangGraph nodes and MCP tools run for real, and the model writes what a good
model would. What is checked is the programs' part: the route a call names is the agent that
answers, the arguments a call writes reach the tool as written (through the examples' own
schemas, named tool choices and grammars), and the answer is the tool's result. Whether the
embedded 135M model writes those calls is test_examples.py's `model_quality` group."""

from __future__ import annotations

import json

import anyio
import pytest

from agentrt.toolcall.formats import HERMES
from tests.scripted_model import last_user, scripted
from tests.test_examples import SUPERVISOR_ROUTES, example

pytestmark = [pytest.mark.embedded, pytest.mark.slow]  # (scripted replies over the embedded GGUF's tokenizer)


def call(name: str, args: dict) -> str:
    """One tool call as the chat format writes it (Hermes: SmolLM2's)."""
    return HERMES.render_calls([(name, args)])


def test_demo_routes_every_question_as_called():
    d = example("multi_agent_tools")

    def reply(prompt: str) -> str:
        q = last_user(prompt)
        specialist, name, args = d.EXPECTED[q]
        if d.ROUTER_INSTRUCTIONS in prompt:
            return call("route", {"topic": q[:30], "specialist": specialist})
        return call(name, args)

    answers = anyio.run(d.run_demo, scripted(reply), d.THREADS, False)
    got = {a.question: (a.route.result, a.specialist and a.specialist.call, a.specialist and a.specialist.arguments)
           for a in answers}
    assert got == d.EXPECTED and all(d.check(a) for a in answers)
    for a in answers:
        assert a.route.call == "route" and a.route.error is None
        assert a.specialist.error is None and a.text == a.specialist.result
        assert a.specialist.result == getattr(d, a.specialist.call)(**a.specialist.arguments)
    # the router's prompt prefix is prefilled once; later conversations reuse it from the radix
    # cache, follow-ups from their own session
    first, *rest = [a.route for a in answers]
    assert first.reused < first.computed
    assert all(r.reused > r.computed for r in rest)


def test_demo_sends_a_question_where_the_route_call_says():
    """The program follows the call, not the question: routed to the calculator, the weather
    question gets the calculator's call."""
    d = example("multi_agent_tools")

    def reply(prompt: str) -> str:
        if d.ROUTER_INSTRUCTIONS in prompt:
            return call("route", {"topic": "weather", "specialist": "calculator"})
        return call("calculate", {"a": 2, "op": "plus", "b": 3})

    (a,) = anyio.run(d.run_demo, scripted(reply), {"t": ["What is the weather in Tokyo?"]}, False)
    assert (a.route.result, a.specialist.agent, a.specialist.call) == ("calculator", "calculator", "calculate")
    assert a.text == "2 + 3 = 5" and not d.check(a)


def test_langgraph_supervisor_routes_as_called():
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage, ToolMessage

    from agentrt import Engine, EngineConfig, Runtime

    s = example("langgraph_supervisor")
    want = SUPERVISOR_ROUTES

    def reply(prompt: str) -> str:
        worker, name, args = want[last_user(prompt)]
        return call("route", {"topic": "the question", "worker": worker}) if s.ROUTER in prompt else call(name, args)

    async def run() -> dict:
        got = {}
        async with Engine(scripted(reply), EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
            graph = s.build(rt)
            for i, q in enumerate(s.QUESTIONS):
                out = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": f"t{i}"}})
                calls = [c for m in out["messages"] for c in getattr(m, "tool_calls", [])]
                results = {m.name: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
                got[q] = (results["route"], calls[-1]["name"], calls[-1]["args"])
                assert results[calls[-1]["name"]] == getattr(s, calls[-1]["name"])(**calls[-1]["args"])
            await rt.stop_all()
        return got

    assert anyio.run(run) == want


def test_mcp_tools_example_calls_the_servers_tools_as_called():
    pytest.importorskip("mcp")
    m = example("mcp_tools")

    def reply(prompt: str) -> str:
        name, city = m.QUESTIONS[last_user(prompt)]
        return call(name, {"city": city})

    got = anyio.run(m.run, scripted(reply))
    assert [(q, name, json.loads(args)["city"]) for q, name, args, _ in got] == \
        [(q, name, city) for q, (name, city) in m.QUESTIONS.items()]
    assert [answer for *_, answer in got] == ["In Paris it is 18 °C and cloudy.", "It is 21:05 in Tokyo.",
                                                "In Oslo it is -3 °C and snowing."]


def test_langgraph_mcp_example_calls_then_answers():
    pytest.importorskip("langchain_mcp_adapters")
    from langchain_core.messages import AIMessage, ToolMessage

    want = {"alice": ("weather", {"city": "Tokyo"}, "In Tokyo it is 24 °C and sunny."),
            "bob": ("local_time", {"city": "Paris"}, "It is 14:05 in Paris.")}
    by_question = {"What is the weather in Tokyo?": "alice", "What time is it in Paris?": "bob"}

    def reply(prompt: str) -> str:
        content = last_user(prompt)  # (SmolLM2's template: a tool result is a user turn)
        if content.startswith("<tool_response>"):  # the answer turn (tool_choice "none")
            return "Here you are: " + content.split("\n")[1]
        name, args, _ = want[by_question[last_user(prompt)]]
        return call(name, args)

    out = anyio.run(example("langgraph_mcp").run, scripted(reply))
    for thread, (name, args, result) in want.items():
        calls = [c for m in out[thread] if isinstance(m, AIMessage) for c in m.tool_calls]
        results = [m.text for m in out[thread] if isinstance(m, ToolMessage)]
        assert [(c["name"], c["args"]) for c in calls] == [(name, args)] and results == [result]
        assert out[thread][-1].text == f"Here you are: {result}"
