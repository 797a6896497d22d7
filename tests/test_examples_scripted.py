"""The examples' programs on scripted replies (tests/scripted_model.py): the engine, agents,
grammar, parser, LangGraph nodes and MCP tools run for real, and the model writes what a good
model would. What is checked is the programs' part: the route a call names is the agent that
answers, the arguments a call writes reach the tool as written (through the examples' own
schemas, named tool choices and grammars), worked examples open an agent's conversation as chat
turns, and the answer is the tool's result when the call's arguments are its question's, and
says there is none when they are not. Whether the embedded 135M model writes those calls is
test_examples.py's `model_quality` group."""

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


def example_turns(examples) -> str:
    """Worked examples (question, tool, arguments) as SmolLM2's template writes them: the question,
    the call, its result (a tool result is a user turn)."""
    return "".join(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{call(fn.name, args)}<|im_end|>\n"
                   f"<|im_start|>user\n<tool_response>\n{fn(**args)}\n</tool_response><|im_end|>\n"
                   for q, fn, args in examples)


def test_demo_routes_every_question_as_called():
    d = example("multi_agent_tools")
    prompts: dict[str, list[str]] = {"router": [], "calculator": []}

    def reply(prompt: str) -> str:
        q = last_user(prompt)
        specialist, name, args = d.EXPECTED[q]
        if d.ROUTER_INSTRUCTIONS in prompt:
            prompts["router"].append(prompt)
            return call("route", {"topic": q[:30], "specialist": specialist})
        if name == "calculate":
            prompts["calculator"].append(prompt)
        return call(name, args)

    answers = anyio.run(d.run_demo, scripted(reply), d.THREADS, False)
    got = {a.question: (a.route.result, a.specialist and a.specialist.call, a.specialist and a.specialist.arguments)
           for a in answers}
    assert got == d.EXPECTED and all(d.check(a) for a in answers)
    for a in answers:
        assert a.route.call == "route" and a.route.error is None
        assert a.specialist.error is None and a.text == a.specialist.result
        assert a.specialist.result == getattr(d, a.specialist.call)(**a.specialist.arguments)
    # the worked examples open every router and calculator conversation once, as chat turns
    # (a call and its result), and the follow-ups in a conversation come after them
    for kind, seen in prompts.items():
        assert seen and all(p.count(example_turns(d.EXAMPLES[kind])) == 1 for p in seen), kind
    # the router's prompt prefix is prefilled once; later conversations reuse it from the radix
    # cache, follow-ups from their own session
    first, *rest = [a.route for a in answers]
    assert first.reused < first.computed
    assert all(r.reused > r.computed for r in rest)


def test_demo_answers_only_what_the_question_says():
    """The program follows the call, not the question: routed to the calculator, the weather
    question gets the calculator's call; the answer is the tool's result only when the call's
    arguments are the question's (`unfounded`), else it says it has none."""
    d = example("multi_agent_tools")
    calls = {"What is the weather in Tokyo?": ("calculator", "calculate", {"a": 2, "op": "add", "b": 3}),
             "What is 1000 minus 1?": ("calculator", "calculate", {"a": 1000, "op": "subtract", "b": 1000}),
             "What is 100 divided by 8?": ("calculator", "calculate", {"a": 100, "op": "multiply", "b": 8}),
             "How long is the train from Rome to Milan?": ("train", "train_time", {"origin": "Milan", "destination": "Rome"}),
             "What is 20 - 8?": ("calculator", "calculate", {"a": 20, "op": "subtract", "b": 8})}

    def reply(prompt: str) -> str:
        specialist, name, args = calls[last_user(prompt)]
        return call("route", {"topic": "it", "specialist": specialist}) if d.ROUTER_INSTRUCTIONS in prompt else \
            call(name, args)

    answers = anyio.run(d.run_demo, scripted(reply), {f"t{i}": [q] for i, q in enumerate(calls)}, False)
    got = {a.question: (a.specialist.agent, a.specialist.result, a.text) for a in answers}
    refusal = "(no answer: the question does not say {}; it is beyond the 135M model or its specialists: " \
              "--model path/to/model.gguf for a bigger model)"
    assert got == {
        "What is the weather in Tokyo?": ("calculator", "2 + 3 = 5", refusal.format("a=2, op='add', b=3")),
        "What is 1000 minus 1?": ("calculator", "1000 - 1000 = 0", refusal.format("b=1000")),
        "What is 100 divided by 8?": ("calculator", "100 * 8 = 800", refusal.format("op='multiply'")),
        "How long is the train from Rome to Milan?": ("train", "Milan -> Rome: 3 h by train",
                                                      refusal.format("origin='Milan' (not the city after 'from')")),
        "What is 20 - 8?": ("calculator", "20 - 8 = 12", "20 - 8 = 12")}
    assert [d.check(a) for a in answers] == [False] * 5  # (not in EXPECTED: not the demo's questions)


def test_langgraph_supervisor_routes_as_called():
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage, ToolMessage

    from agentrt import Engine, EngineConfig, Runtime

    s = example("langgraph_supervisor")
    want = SUPERVISOR_ROUTES
    prompts: dict[str, list[str]] = {"supervisor": [], "math": []}

    def reply(prompt: str) -> str:
        specialist, name, args = want[last_user(prompt)]
        if s.ROUTER in prompt:
            prompts["supervisor"].append(prompt)
            return call("route", {"topic": "the question", "specialist": specialist})
        if name == "calculate":
            prompts["math"].append(prompt)
        return call(name, args)

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
                assert s.answer(q, out["messages"]) == results[calls[-1]["name"]]
            await rt.stop_all()
        return got

    assert anyio.run(run) == want
    # each supervisor and math conversation opens with its worked examples, as chat turns
    for name, seen in prompts.items():
        assert seen and all(p.count(example_turns(s.EXAMPLES[name])) == 1 for p in seen), name


def test_langgraph_supervisor_answers_only_what_the_question_says():
    """A call whose arguments the question does not say is no answer; the graph still ends."""
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage

    from agentrt import Engine, EngineConfig, Runtime

    s = example("langgraph_supervisor")
    calls = {"What is the weather in Oslo?": ("flight", "find_flight", {"origin": "Oslo", "destination": "Oslo"}),
             "What is 45 minus 17?": ("math", "calculate", {"a": 45, "op": "multiply", "b": 17}),
             "Is it raining in London?": ("weather", "get_weather", {"city": "Londres"})}

    def reply(prompt: str) -> str:
        specialist, name, args = calls[last_user(prompt)]
        return call("route", {"topic": "it", "specialist": specialist}) if s.ROUTER in prompt else call(name, args)

    async def run() -> dict:
        got = {}
        async with Engine(scripted(reply), EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
            graph = s.build(rt)
            for i, q in enumerate(calls):
                out = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": f"t{i}"}})
                got[q] = s.answer(q, out["messages"])
            await rt.stop_all()
        return got

    refusal = "no answer: the question does not say {}; it is beyond the 135M model or its specialists: " \
              "--model path/to/model.gguf for a bigger model"
    assert anyio.run(run) == {"What is the weather in Oslo?": refusal.format("find_flight's origin = destination"),
                              "What is 45 minus 17?": refusal.format("calculate's op='multiply'"),
                              "Is it raining in London?": refusal.format("get_weather's city='Londres'")}


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
