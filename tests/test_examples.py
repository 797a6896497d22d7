"""The examples on the embedded SmolLM2-135M: the multi-agent demo (`make demo`) routes every
question to the right specialist, which calls the right tool with the right arguments; the
LangGraph supervisor routes its questions too; both answer questions beyond their own right
(weather, trips, and arithmetic with + - * /), and a question beyond the 135M model gets no
answer rather than a wrong one. Whether the 135M model answers each question right is its
quality, not the API's: those tests are `model_quality` (reported by `make test`, never failing
it); test_examples_scripted.py runs the same programs on scripted replies, where the routing,
the tool arguments and the check of a call against its question are the API's. Plus the pure
helpers of the examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import anyio
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    """Import examples/<name>.py as a module (the folder is not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_model(request):
    """The model as the demo loads it (quantize="auto": the GGUF's own blocks through the compiled
    kernels where they build, else fp32), shared with the session fixtures of conftest."""
    from agentrt.kernels import native

    return request.getfixturevalue("embedded_native" if native.available() else "embedded")


# ---- pure: the demo's tools and run_gguf's checks ---------------------------------------------

def test_demo_tools():
    d = example("multi_agent_tools")
    assert d.calculate(a=12, op="multiply", b=7) == "12 * 7 = 84"
    assert d.calculate(a=45, op="subtract", b=17) == "45 - 17 = 28"
    assert d.calculate(a=100, op="divide", b=8) == "100 / 8 = 12.5"
    assert d.calculate(a=2.5, op="add", b=4) == "2.5 + 4 = 6.5"
    assert d.calculate(a=1, op="divide", b=0) == "1 / 0: division by zero"
    assert d.get_weather(city="tokyo") == "tokyo: 24 °C, sunny"
    assert d.get_weather(city="Atlantis") == "no weather data for Atlantis"
    assert d.train_time(origin="Lyon", destination="Paris") == "Lyon -> Paris: 2 h by train"
    assert set(d.EXPECTED) == {q for qs in d.THREADS.values() for q in qs}
    # the demo's own questions take each operation at least once
    assert {args.get("op") for _, _, args in d.EXPECTED.values()} >= {"add", "subtract", "multiply", "divide"}


@pytest.mark.parametrize("name", ["multi_agent_tools", "langgraph_supervisor"])
def test_calls_are_checked_against_the_question(name):
    """`unfounded`: what a call says that its question does not (a made-up number, city or
    operation, a number used twice, a trip backwards or to where it starts)."""
    if name == "langgraph_supervisor":
        pytest.importorskip("langgraph")
    u = example(name).unfounded
    assert u("What is 45 minus 17?", {"a": 45, "op": "subtract", "b": 17}) == []
    assert u("What is 2.5 + 4?", {"a": 2.5, "op": "add", "b": 4.0}) == []
    assert u("What is 72 / 8?", {"a": 72, "op": "divide", "b": 8}) == []
    assert u("What is 7 x 6?", {"a": 7, "op": "multiply", "b": 6}) == []
    assert u("Subtract 5 from 30.", {"a": 30, "op": "subtract", "b": 5}) == []
    assert u("What is 100 divided by 8?", {"a": 100, "op": "multiply", "b": 8}) == ["op='multiply'"]
    assert u("What is 1000 minus 1?", {"a": 1000, "op": "subtract", "b": 1000}) == ["b=1000"]
    assert u("What is 2.5 times 4?", {"a": 2.5, "op": "multiply", "b": 4.5}) == ["b=4.5"]
    assert u("Is it sunny in Rome?", {"a": 1, "op": "add", "b": 2}) == ["a=1", "op='add'", "b=2"]
    assert u("Is it raining in London?", {"city": "London"}) == []
    assert u("Is there snow in Zurich?", {"city": "Zuraforr"}) == ["city='Zuraforr'"]
    assert u("What is 15 plus 27?", {"city": "15"}) == ["city='15'"]
    assert u("A flight from Paris to Rome?", {"origin": "Paris", "destination": "Rome"}) == []
    assert u("A flight to Rome from Paris?", {"origin": "Paris", "destination": "Rome"}) == []
    assert u("Are there flights from Tokyo to Oslo?", {"origin": "Oslo", "destination": "Tokyo"}) == \
        ["origin='Oslo' (not the city after 'from')"]
    assert u("Is it snowing in Oslo?", {"origin": "Oslo", "destination": "Oslo"}) == ["origin = destination"]


def test_run_gguf_checks():
    g = example("run_gguf")
    assert g.made_up_arguments("What is 23 times 19?", {"a": 23, "op": "*", "b": 19.0}) == []
    assert g.made_up_arguments("What is the weather in Paris?", {"a": 10, "op": "+", "b": 10}) == ["a=10", "b=10"]
    assert g.made_up_arguments("What is 100 divided by 8?", {"city": "Paris"}) == ["city='Paris'"]
    result = {"expression": "23 * 19", "result": 437.0}
    assert g.answer_problem("23 * 19 = 437.", result) is None
    assert "missing" in g.answer_problem("It is 427.", result)
    assert "markup" in g.answer_problem("<tru_calle_response>\n437", result)
    assert "repetition" in g.answer_problem("437 truc_truc_truc_truc_truc_truc", result)
    assert g.answer_problem("  ", result) == "it wrote no answer"
    content = '{"expression": "23 * 19", "result": 437.0}'
    assert "repeated" in g.answer_problem(content, result, content)


# ---- the embedded model -----------------------------------------------------------------------

@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_demo_routes_every_question(demo_model):
    d = example("multi_agent_tools")
    answers = anyio.run(d.run_demo, demo_model, d.THREADS, False)
    got = {a.question: (a.route.result, a.specialist and a.specialist.call, a.specialist and a.specialist.arguments)
           for a in answers}
    assert got == d.EXPECTED
    for a in answers:
        assert a.route.call == "route" and a.route.error is None
        assert a.specialist.error is None and a.text == a.specialist.result
        assert not a.text.startswith("no "), a.text  # every demo question is in the tools' tables
    # the router's prompt prefix (instructions, schema, examples) is prefilled once; later
    # conversations reuse it from the radix cache, follow-ups from their own session
    first, *rest = [a.route for a in answers]
    assert first.reused < first.computed
    assert all(r.reused > r.computed for r in rest)


# questions beyond the demo's own (none of them in THREADS or a worked example), each in its own
# conversation: question -> (the specialist, the answer)
DEMO_NEW = {
    "Is it snowing in Oslo?": ("weather", "Oslo: -3 °C, snowing"),
    "Is it sunny in Madrid today?": ("weather", "Madrid: 31 °C, sunny"),
    "Will it rain in Paris tomorrow?": ("weather", "Paris: 18 °C, cloudy"),
    "How long is the train from Berlin to Munich?": ("train", "Berlin -> Munich: 4 h by train"),
    "What is 45 minus 17?": ("calculator", "45 - 17 = 28"),
    "What is 300 - 45?": ("calculator", "300 - 45 = 255"),
    "What is 120 divided by 8?": ("calculator", "120 / 8 = 15"),
    "What is 72 / 8?": ("calculator", "72 / 8 = 9"),
    "What is 13 times 13?": ("calculator", "13 * 13 = 169"),
    "What is 9 multiplied by 7?": ("calculator", "9 * 7 = 63"),
    "What is 250 + 750?": ("calculator", "250 + 750 = 1000"),
    "Train time from Munich to Berlin?": ("train", "Munich -> Berlin: 4 h by train"),
    "What is 56 minus 14?": ("calculator", "56 - 14 = 42"),
    "What is 63 / 9?": ("calculator", "63 / 9 = 7"),
    "What is 3.5 + 1.5?": ("calculator", "3.5 + 1.5 = 5"),
    "What is 1000 divided by 40?": ("calculator", "1000 / 40 = 25"),
}
# beyond the 135M model (it writes a number or a city the question does not say): the right
# answer or none, never a wrong one
DEMO_HARD = {"Take 12 away from 50.": "50 - 12 = 38", "What is half of 50?": "50 / 2 = 25",
             "Is there a train from Rome to Milan?": "Rome -> Milan: 3 h by train"}
# for none of the specialists: no answer
OFF_TOPIC = ["Who wrote Hamlet?", "What is the capital of France?", "Tell me a joke."]


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_demo_answers_new_questions(demo_model):
    d = example("multi_agent_tools")
    questions = [*DEMO_NEW, *DEMO_HARD, *OFF_TOPIC]
    answers = anyio.run(d.run_demo, demo_model, {f"q{i}": [q] for i, q in enumerate(questions)}, False)
    got = {a.question: (a.route.result, a.text) for a in answers}
    assert {q: got[q] for q in DEMO_NEW} == DEMO_NEW
    for q, right in DEMO_HARD.items():
        assert got[q][1] == right or got[q][1].startswith("(no answer: the question does not say"), got[q]
    for q in OFF_TOPIC:
        assert got[q][1].startswith("(no answer: the question does not say"), got[q]


# the supervisor example's questions -> (specialist, tool, arguments) each must be routed to
SUPERVISOR_ROUTES = {
    "What is the weather in Oslo?": ("weather", "get_weather", {"city": "Oslo"}),
    "What is 12 times 7?": ("math", "calculate", {"a": 12, "op": "multiply", "b": 7}),
    "Find me a flight from Paris to Rome.": ("flight", "find_flight", {"origin": "Paris", "destination": "Rome"}),
    "Is it raining in London?": ("weather", "get_weather", {"city": "London"}),
    "What is 100 divided by 8?": ("math", "calculate", {"a": 100, "op": "divide", "b": 8}),
    "What is 45 minus 17?": ("math", "calculate", {"a": 45, "op": "subtract", "b": 17})}
# questions beyond the supervisor's own: question -> (specialist, answer)
SUPERVISOR_NEW = {
    "Is it snowing in Oslo?": ("weather", "Oslo: -3 °C, snowing"),
    "Will it rain in Paris tomorrow?": ("weather", "Paris: 18 °C, cloudy"),
    "Is it cloudy in Paris?": ("weather", "Paris: 18 °C, cloudy"),
    "Book a flight from London to Berlin.": ("flight", "London -> Berlin: direct, 2 h 30, 129 EUR (demo data)"),
    "Can I fly from Paris to Tokyo?": ("flight", "Paris -> Tokyo: direct, 2 h 30, 129 EUR (demo data)"),
    "What is 33 plus 44?": ("math", "33 + 44 = 77"),
    "What is 200 - 1?": ("math", "200 - 1 = 199"),
    "What is 120 divided by 8?": ("math", "120 / 8 = 15"),
    "What is 72 / 8?": ("math", "72 / 8 = 9"),
    "What is 13 times 13?": ("math", "13 * 13 = 169"),
    "What is 9 multiplied by 7?": ("math", "9 * 7 = 63"),
    "Is it hot in Paris?": ("weather", "Paris: 18 °C, cloudy"),
    "Is there a flight from Lyon to Paris?": ("flight", "Lyon -> Paris: direct, 2 h 30, 129 EUR (demo data)"),
    "What is 63 / 9?": ("math", "63 / 9 = 7"),
    "What is 3.5 + 1.5?": ("math", "3.5 + 1.5 = 5"),
}
SUPERVISOR_HARD = {"Take 12 away from 50.": "50 - 12 = 38", "What is half of 50?": "50 / 2 = 25",
                   "Is it foggy in Tokyo?": "Tokyo: 24 °C, sunny",
                   "Find me a flight from Tokyo to London.": "Tokyo -> London: direct, 2 h 30, 129 EUR (demo data)"}


def run_supervisor(model, questions) -> dict:
    """Each question through the supervisor graph in its own thread: question -> (the route's
    specialist, the last call's name and arguments, the program's answer)."""
    from langchain_core.messages import HumanMessage, ToolMessage

    from agentrt import Engine, EngineConfig, Runtime

    s = example("langgraph_supervisor")

    async def run() -> dict:
        got = {}
        async with Engine(model, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
            graph = s.build(rt)
            for i, q in enumerate(questions):
                out = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": f"t{i}"}})
                calls = [c for m in out["messages"] for c in getattr(m, "tool_calls", [])]
                routed = next(m.content for m in out["messages"] if isinstance(m, ToolMessage) and m.name == "route")
                got[q] = (routed, calls[-1]["name"], calls[-1]["args"], s.answer(q, out["messages"]))
            await rt.stop_all()
        return got

    return anyio.run(run)


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_langgraph_supervisor_routes(demo_model):
    pytest.importorskip("langgraph")
    s = example("langgraph_supervisor")
    assert set(SUPERVISOR_ROUTES) == set(s.QUESTIONS)
    got = run_supervisor(demo_model, s.QUESTIONS)
    assert {q: g[:3] for q, g in got.items()} == SUPERVISOR_ROUTES
    assert all(not g[3].startswith("no answer") for g in got.values())


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_langgraph_supervisor_answers_new_questions(demo_model):
    pytest.importorskip("langgraph")
    got = run_supervisor(demo_model, [*SUPERVISOR_NEW, *SUPERVISOR_HARD, *OFF_TOPIC])
    assert {q: (got[q][0], got[q][3]) for q in SUPERVISOR_NEW} == SUPERVISOR_NEW
    for q, right in SUPERVISOR_HARD.items():
        assert got[q][3] == right or got[q][3].startswith("no answer: the question does not say"), got[q]
    for q in OFF_TOPIC:
        assert got[q][3].startswith("no answer: the question does not say"), got[q]


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_mcp_tools_example_calls_the_servers_tools(demo_model):
    """examples/mcp_tools.py: its MCP server's tools, called right by agents on the 135M model."""
    pytest.importorskip("mcp")
    m = example("mcp_tools")
    got = anyio.run(m.run, demo_model)
    import json

    assert [(q, name, json.loads(args)["city"]) for q, name, args, _ in got] == \
        [(q, name, city) for q, (name, city) in m.QUESTIONS.items()]
    assert [answer for *_, answer in got] == ["In Paris it is 18 °C and cloudy.", "It is 21:05 in Tokyo.",
                                                "In Oslo it is -3 °C and snowing."]


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_langgraph_mcp_example_runs_the_servers_tools(demo_model):
    """examples/langgraph_mcp.py: langchain-mcp-adapters' tools in a LangGraph graph on ChatAgentrt."""
    pytest.importorskip("langchain_mcp_adapters")
    from langchain_core.messages import AIMessage, ToolMessage

    out = anyio.run(example("langgraph_mcp").run, demo_model)
    want = {"alice": ("weather", {"city": "Tokyo"}, "In Tokyo it is 24 °C and sunny."),
            "bob": ("local_time", {"city": "Paris"}, "It is 14:05 in Paris.")}
    for thread, (name, args, result) in want.items():
        calls = [c for m in out[thread] if isinstance(m, AIMessage) for c in m.tool_calls]
        results = [m.text for m in out[thread] if isinstance(m, ToolMessage)]
        assert [(c["name"], c["args"]) for c in calls] == [(name, args)] and results == [result]
