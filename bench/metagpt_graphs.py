"""The MetaGPT workflows as LangGraph graphs on agentrt agents (bench/metagpt_workload.py says
what they are). Every node is an agentrt `Agent` through `agent_node` (its role prompt as its
static prefix, one required tool call, the tool, a short answer), wrapped to note the visit
(`Recorder.enter`) and to read what its tool said:

- SOP: START -> product_manager -> architect -> project_manager -> engineer -> qa, and a
  conditional edge from qa: its tool's verdict "fix" goes back to the engineer (whose agent
  continues its own session), "pass" ends the task.
- TL: START -> leader, whose tool's assignment becomes a `Send` per named role (the fan-out's
  width decided at run time), every role -> gather (the leader's prompt and tool) -> END.

The tools follow the task's plan (`current_task()` names the task; `Recorder.entered` the visit):
they sleep the planned latency and return the planned verdict or assignment, so a graph run
follows the same seeded plan the simulator's workload does. Each graph invocation is one task
(`task_scope`, its own thread), started at its arrival; its agents' actors are stopped (sessions
closed) when it ends. The workflow is declared with `declare_graph` (the DAG from the compiled
graph: QA's way back to the engineer is a back edge, dropped)."""

from __future__ import annotations

import time

import anyio

from agentrt import Agent, Engine, SamplingParams, task_scope
from agentrt.tools import Tool
from agentrt.workflow import current_task
from bench.metagpt_run import Recorder, result_of
from bench.metagpt_workload import (
    SOP_STAGES,
    TEAM,
    WORKFLOWS,
    MetaPlan,
    MetaSizes,
    instructions,
    tool_result,
    tool_schema,
)
from bench.workflow_run import engine_stats, run_at_arrivals


def _tool(tok, stage: str, plans: dict[str, MetaPlan], rec: Recorder) -> Tool:
    async def fn(query: str) -> str:
        task = current_task().task_id
        k = rec.entered[(task, stage)]
        plan = plans[task]
        v = plan.visits_of(stage)[k - 1]
        await anyio.sleep(v.tool_s)
        return tool_result(tok, plan, v, k)

    return Tool.from_openai(tool_schema(stage), fn)


def _agent(tok, stage: str, sizes: MetaSizes, plans, rec) -> Agent:
    return Agent(stage, instructions(tok, stage, sizes.prefix_tokens), [_tool(tok, stage, plans, rec)],
                 tool_choice="required", max_tool_rounds=1, parallel_tool_calls=False,
                 settings=SamplingParams(max_tokens=sizes.out_tokens))


def _said(msgs) -> str:
    """What the turn's tool returned (the first tool message's text)."""
    from langchain_core.messages import ToolMessage

    return next((str(m.content) for m in msgs if isinstance(m, ToolMessage)), "")


def _node(rt, tok, stage: str, sizes, plans, rec, read=None):
    """agent_node for `stage`, noting each visit; `read(tool_text)` -> extra state from its tool."""
    from agentrt.integrations.langgraph import agent_node

    inner = agent_node(_agent(tok, stage, sizes, plans, rec), rt)

    async def node(state: dict, config) -> dict:
        rec.enter(current_task().task_id, stage)
        out = await inner(state, config)
        return out | (read(_said(out["messages"])) if read else {})

    node.__name__ = stage
    return node


def build_sop(rt, tok, sizes: MetaSizes, plans: dict[str, MetaPlan], rec: Recorder):
    from langgraph.graph import END, START, MessagesState, StateGraph

    class State(MessagesState):
        verdict: str

    g = StateGraph(State)
    prev = START
    for s in SOP_STAGES:
        read = (lambda text: {"verdict": "fix" if text.startswith("fix") else "pass"}) if s == "qa" else None
        g.add_node(s, _node(rt, tok, s, sizes, plans, rec, read))
        g.add_edge(prev, s)
        prev = s
    g.add_conditional_edges("qa", lambda st: "engineer" if st["verdict"] == "fix" else END, ["engineer", END])
    return g.compile(name="metagpt_sop")


def build_tl(rt, tok, sizes: MetaSizes, plans: dict[str, MetaPlan], rec: Recorder):
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.types import Send

    class State(MessagesState):
        assign: list[str]

    def assignment(text: str) -> dict:
        head = text.split(".", 1)[0].removeprefix("assign:")
        return {"assign": [r.strip() for r in head.split(",") if r.strip() in TEAM]}

    g = StateGraph(State)
    g.add_node("leader", _node(rt, tok, "leader", sizes, plans, rec, assignment))
    for r in TEAM:
        g.add_node(r, _node(rt, tok, r, sizes, plans, rec))
        g.add_edge(r, "gather")
    g.add_node("gather", _node(rt, tok, "gather", sizes, plans, rec))
    g.add_edge(START, "leader")
    g.add_conditional_edges("leader", lambda st: [Send(r, {"messages": st["messages"]}) for r in st["assign"]],
                            list(TEAM))
    g.add_edge("gather", END)
    return g.compile(name="metagpt_tl")


BUILD = {"metagpt_sop": build_sop, "metagpt_tl": build_tl}


def question(tok, plan: MetaPlan, sizes: MetaSizes) -> str:
    import random

    from bench.workflow_workload import _seed
    from bench.workloads.agentic import text_of_tokens

    rng = random.Random(_seed("metagpt-request", plan.task_id))
    return f"Request {plan.index}: build this. " + text_of_tokens(tok, rng.randrange(*sizes.user_tokens), rng)


async def run_graph(lm, cfg, workflow: str, plans: list[MetaPlan], sizes: MetaSizes, timeout: float,
                    sequential: bool = False, rec: Recorder | None = None) -> dict:
    """Every plan's task through the workflow's graph on one engine built from cfg, each started at
    its arrival (`sequential`: one at a time). Returns run_dag's figures plus `visits` (task id ->
    the stages the graph ran, in order of their start) and `recorder` (every model call)."""
    from langchain_core.messages import HumanMessage

    from agentrt import Runtime
    from agentrt.integrations.langgraph import declare_graph, workflow_of

    rec = rec or Recorder()
    by_id = {p.task_id: p for p in plans}
    jct: dict[str, float] = {}
    async with Engine(lm, cfg) as eng, Runtime(eng) as rt:
        rec.install(eng)
        app = BUILD[workflow](rt, lm.tokenizer, sizes, by_id, rec)
        edges = {s: sorted(n) for s, n in workflow_of(app, workflow).edges.items()}
        if edges != {s: sorted(n) for s, n in WORKFLOWS[workflow].edges.items()}:  # the plans' DAG
            raise AssertionError(f"{workflow}: the graph's DAG {edges} is not the workload's")
        app = declare_graph(eng, app, workflow)

        async def run_task(plan: MetaPlan, start: float) -> None:
            await anyio.sleep(max(0.0, start - time.perf_counter()))
            with task_scope(plan.task_id, workflow=workflow):
                await app.ainvoke({"messages": [HumanMessage(question(lm.tokenizer, plan, sizes))]},
                                  {"configurable": {"thread_id": plan.task_id}, "recursion_limit": 100})
            jct[plan.task_id] = time.perf_counter() - start
            for stage in WORKFLOWS[workflow].stages:
                ref = rt.actors.get(f"{stage}/{plan.task_id}")
                if ref is not None:
                    await ref.stop()

        wall, timed_out = await run_at_arrivals(run_task, plans, [p.arrival for p in plans], timeout, sequential,
                                                clock=time.perf_counter)
        stats = engine_stats(eng)
        await rt.stop_all()
    ivs = rec.intervals()
    ttfts = [c["ttft"] for c in rec.calls if c["ttft"] is not None]
    out = result_of(plans, jct, ivs, ttfts, wall, timed_out, stats)
    out["visits"] = {t: [s for tt, s in rec.log if tt == t] for t in by_id}
    out["workflow_edges"] = edges
    out["recorder"] = rec
    return out
