"""Tasks reach the engine without the user doing anything (issue 15): Runtime messages carry the
sender's task (a fresh one per top-level message), LangGraph runs are tasks whose stages are the
agent / node names, `workflow_of` turns a graph into a DAG, and bad arguments raise typed errors.
On a tiny random model; what the engine records is read from its TaskTracker."""

from __future__ import annotations

import inspect
from typing import Literal

import anyio
import pytest
from langchain_core.messages import HumanMessage
from typing_extensions import TypedDict

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, Workflow, current_task, task_scope, tool
from agentrt.errors import ConfigError
from agentrt.integrations.langgraph import ChatAgentrt, agent_node, declare_graph, workflow_of
from tests.conftest import tiny_model_with_tokenizer

CFG = EngineConfig(kv_cache_tokens=8192, response_cache_size=0)
P = SamplingParams(max_tokens=4)


def record(eng) -> list[tuple]:
    """(task, workflow, stage) of every request the engine's task tracker observes from now on."""
    seen: list[tuple] = []
    tracker = eng.core.tasks
    observe, sig = tracker.observe, inspect.signature(tracker.observe)

    def spy(*args, **kwargs):
        a = sig.bind(*args, **kwargs).arguments
        seen.append((a["task_id"], a["workflow"], a["stage"]))
        return observe(*args, **kwargs)
    tracker.observe = spy
    return seen


def with_engine(fn):
    async def main():
        async with Engine(tiny_model_with_tokenizer(), CFG) as eng:
            return await fn(eng)
    return anyio.run(main)


def by_task(seen) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for task, _, stage in seen:
        out.setdefault(task, []).append(stage)
    return out


# ---- Runtime --------------------------------------------------------------------------------
class Probe:
    """Answers with the task it handles the message in; "ask:<name>" asks that actor first."""

    async def handle(self, msg, ctx):
        if isinstance(msg, str) and msg.startswith("ask:"):
            return current_task(), await ctx.runtime.get(msg[4:]).ask("inner")
        return current_task()


def test_messages_carry_the_senders_task_or_a_fresh_one():
    async def main():
        async with Runtime() as rt:
            a, b = await rt.spawn(Probe(), name="a"), await rt.spawn(Probe(), name="b")
            first, second = await a.ask("x"), await a.ask("x", workflow="review")
            assert first.task_id != second.task_id and first.workflow is None and second.workflow == "review"
            outer, inner = await a.ask("ask:b")
            assert inner == outer  # the asked actor works for the asker's task
            with task_scope("job-1", workflow="w") as ctx:
                assert await b.ask("x") == ctx
                assert [t async for t in b.ask_stream("x")] == [ctx]
                assert await b.ask("x", workflow="w") == ctx
                with pytest.raises(ConfigError, match="a task follows one workflow"):
                    await b.ask("x", workflow="other")
            for bad in ("", 3):
                with pytest.raises(ConfigError, match="workflow must be"):
                    await a.ask("x", workflow=bad)
                with pytest.raises(ConfigError, match="workflow must be"):
                    await a.tell("x", workflow=bad)
    anyio.run(main)


def test_agent_requests_carry_a_task_per_ask_and_its_tool_calls_keep_it():
    refs: dict = {}
    ran: list = []

    @tool
    async def consult(urgent: bool) -> str:
        """Ask the helper.

        Args:
            urgent: whether it is urgent
        """
        ran.append(current_task())
        return (await refs["helper"].ask("help me")).text

    async def fn(eng):
        seen = record(eng)
        async with Runtime(eng) as rt:
            refs["helper"] = await rt.spawn(Agent("helper", "Be terse.", settings=P))
            planner = await rt.spawn(Agent("planner", "Use the tool.", [consult], tool_choice="required",
                                           max_tool_rounds=1, settings=SamplingParams(max_tokens=48)))
            await planner.ask("plan it")
            await planner.ask("plan again", workflow="plan")
            await refs["helper"].ask("alone")
        return seen
    seen = with_engine(fn)

    assert len(ran) == 2 and ran[0].task_id != ran[1].task_id
    tasks = by_task(seen)
    assert len(tasks) == 3  # two planner asks (helper consulted inside each), one helper ask
    for ctx in ran:  # the planner's rounds and the helper it consulted: one task
        assert tasks[ctx.task_id] == ["planner", "helper", "planner"]
    assert {w for t, w, _ in seen if t == ran[1].task_id} == {"plan"}
    assert [s for t, s in tasks.items() if t not in {c.task_id for c in ran}] == [["helper"]]


# ---- LangGraph ------------------------------------------------------------------------------
def three_node_graph(rt, model, checkpointer=None):
    """planner (agent_node) -> writer (agent_node) -> critic (a ChatAgentrt call)."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    async def critic(state):
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node(agent_node(Agent("planner", "Plan.", settings=P), rt))
    g.add_node(agent_node(Agent("writer", "Write.", settings=P), rt, output="last_message"))
    g.add_node("critic", critic)
    g.add_edge(START, "planner")
    g.add_edge("planner", "writer")
    g.add_edge("writer", "critic")
    g.add_edge("critic", END)
    return g.compile(checkpointer=checkpointer, name="review")


@pytest.mark.parametrize("threaded", [False, True])
def test_each_graph_run_is_one_task_staged_by_node(threaded):
    from langgraph.checkpoint.memory import InMemorySaver

    async def fn(eng):
        seen = record(eng)
        model = ChatAgentrt(engine=eng, max_tokens=4)
        async with Runtime(eng) as rt:
            app = three_node_graph(rt, model, InMemorySaver() if threaded else None)
            conf = {"configurable": {"thread_id": "t1"}} if threaded else None
            for q in ("first", "second"):
                await app.ainvoke({"messages": [HumanMessage(q)]}, conf)
            with task_scope("mine", workflow="w"):  # an enclosing scope wins
                await app.ainvoke({"messages": [HumanMessage("third")]}, conf)
        sessions = {k: rs.session._es.tag for k, rs in model.sessions.items()}
        await model.arelease()
        return seen, sessions
    seen, sessions = with_engine(fn)

    tasks = by_task(seen)
    assert list(tasks.values()) == [["planner", "writer", "critic"]] * 3
    assert list(tasks)[2] == "mine" and len(set(tasks)) == 3
    assert [w for t, w, _ in seen] == [None] * 6 + ["w"] * 3
    assert sessions == ({"t1/critic": "critic"} if threaded else {})  # a routed session is tagged by its node


def test_declare_graph_names_the_workflow_of_each_run():
    async def fn(eng):
        seen = record(eng)
        model = ChatAgentrt(engine=eng, max_tokens=4)
        async with Runtime(eng) as rt:
            app = declare_graph(eng, three_node_graph(rt, model))
            assert eng.core.tasks.workflows["review"] == Workflow.chain("review", "planner", "writer", "critic")
            await app.ainvoke({"messages": [HumanMessage("go")]})
            await app.ainvoke({"messages": [HumanMessage("go")]}, {"configurable": {"agentrt_workflow": "other"}})
            with pytest.raises(ConfigError, match="agentrt_workflow"):
                await app.ainvoke({"messages": [HumanMessage("go")]}, {"configurable": {"agentrt_workflow": 5}})
        return seen
    seen = with_engine(fn)
    assert [w for _, w, _ in seen[:6]] == ["review"] * 3 + ["other"] * 3
    assert len(by_task(seen[:6])) == 2


def test_sync_graph_on_another_loop_carries_the_run_task():
    """A sync graph's ChatAgentrt calls go through the engine's portal: the task still arrives. A
    model's own `name` is its stage."""
    from langgraph.graph import END, START, MessagesState, StateGraph

    from agentrt.integrations.langgraph.host import EngineHost

    host = EngineHost.start(lambda: Engine(tiny_model_with_tokenizer(), CFG))
    try:
        seen = record(host.engine)
        model, named = ChatAgentrt(host=host, max_tokens=4), ChatAgentrt(host=host, max_tokens=4, name="editor")
        g = StateGraph(MessagesState)
        g.add_node("draft", lambda state: {"messages": [model.invoke(state["messages"])]})
        g.add_node("polish", lambda state: {"messages": [named.invoke(state["messages"])]})
        g.add_edge(START, "draft")
        g.add_edge("draft", "polish")
        g.add_edge("polish", END)
        app = g.compile()
        app.invoke({"messages": [HumanMessage("a")]})
        app.invoke({"messages": [HumanMessage("b")]})
    finally:
        host.close()
    assert list(by_task(seen).values()) == [["draft", "editor"]] * 2


# ---- workflow_of ----------------------------------------------------------------------------
class S(TypedDict):
    x: int


def _node(state):
    return state


def test_workflow_of_a_graph_with_a_conditional_edge_and_a_cycle():
    from langgraph.graph import END, START, StateGraph

    def route(state) -> Literal["tools", "answer"]:
        return "tools"

    g = StateGraph(S)
    for n in ("agent", "tools", "answer", "orphan"):
        g.add_node(n, _node)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route)
    g.add_edge("tools", "agent")  # the loop's way back: dropped
    g.add_edge("answer", END)
    wf = workflow_of(g.compile(), "loop")
    assert wf.name == "loop" and wf.entries == ("agent", "orphan")
    assert {s: sorted(v) for s, v in wf.edges.items()} == {"agent": ["answer", "tools"], "tools": [], "answer": [],
                                                           "orphan": []}
    assert workflow_of(g.compile(name="named")).name == "named"


def test_workflow_of_names_agent_nodes_by_their_agent():
    from langgraph.graph import START, MessagesState, StateGraph

    g = StateGraph(MessagesState)
    g.add_node("research", agent_node(Agent("researcher", settings=P), runtime=None))
    g.add_node("report", _node)
    g.add_edge(START, "research")
    g.add_edge("research", "report")
    assert workflow_of(g.compile(), "r").edges == {"researcher": ("report",), "report": ()}


def test_bad_arguments_raise_config_errors():
    from langgraph.graph import START, StateGraph

    g = StateGraph(S)
    g.add_node("a", _node)
    g.add_edge(START, "a")
    with pytest.raises(ConfigError, match=r"pass builder.compile\(\)"):
        workflow_of(g)
    with pytest.raises(ConfigError, match="compiled LangGraph graph"):
        workflow_of(object())
    with pytest.raises(ConfigError, match="name must be a non-empty str"):
        workflow_of(g.compile(), "")
    with pytest.raises(ConfigError, match="takes an agentrt Engine"):
        declare_graph(object(), g.compile())
