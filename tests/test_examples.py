"""The examples on the embedded SmolLM2-135M: the multi-agent demo (`make demo`) routes every
question to the right specialist, which calls the right tool with the right arguments; the
LangGraph supervisor routes its questions too. Whether the 135M model answers each question
right is its quality, not the API's: those tests are `model_quality` (reported by `make test`,
never failing it); test_examples_scripted.py runs the same programs on scripted replies, where
the routing and the tool arguments are the API's. Plus the pure helpers of the examples."""

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
    assert d.calculate(a=12, op="times", b=7) == "12 * 7 = 84"
    assert d.calculate(a=1, op="divided by", b=0) == "1 / 0: division by zero"
    assert d.get_weather(city="tokyo") == "tokyo: 24 °C, sunny"
    assert d.get_weather(city="Atlantis") == "no weather data for Atlantis"
    assert d.train_time(origin="Lyon", destination="Paris") == "Lyon -> Paris: 2 h by train"
    assert set(d.EXPECTED) == {q for qs in d.THREADS.values() for q in qs}


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


# the supervisor example's questions -> (worker, tool, arguments) each must be routed to
SUPERVISOR_ROUTES = {
    "What is the weather in Oslo?": ("weather", "get_weather", {"city": "Oslo"}),
    "What is 12 times 7?": ("calculator", "calculate", {"a": 12, "op": "*", "b": 7}),
    "Find me a flight from Paris to Rome.": ("flights", "find_flight", {"origin": "Paris", "destination": "Rome"}),
    "Is it raining in London?": ("weather", "get_weather", {"city": "London"})}

@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.model_quality
def test_langgraph_supervisor_routes(demo_model):
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage, ToolMessage

    from agentrt import Engine, EngineConfig, Runtime

    s = example("langgraph_supervisor")
    want = SUPERVISOR_ROUTES
    assert set(want) == set(s.QUESTIONS)

    async def run() -> dict:
        got = {}
        async with Engine(demo_model, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
            graph = s.build(rt)
            for i, q in enumerate(s.QUESTIONS):
                out = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": f"t{i}"}})
                calls = [c for m in out["messages"] for c in getattr(m, "tool_calls", [])]
                routed = next(m.content for m in out["messages"] if isinstance(m, ToolMessage) and m.name == "route")
                got[q] = (routed, calls[-1]["name"], calls[-1]["args"])
            await rt.stop_all()
        return got

    assert anyio.run(run) == want


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
