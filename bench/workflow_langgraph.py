"""The LangGraph case of bench_workflows.py: planner -> worker -> reviewer, each node an agentrt
`Agent` through `agent_node` (its own long instructions + one tool; one required tool call, the
tool (a sleep), then a short answer: two model calls per node). Each graph invocation is one task
(`agentrt.task_scope`, its own LangGraph thread), started at its Poisson arrival time; its
agents' actors are stopped (sessions closed) when it ends. The workflow is declared to the engine
(`declare_graph`: the DAG derived from the compiled graph; by hand where the adapter lacks it)."""

from __future__ import annotations

import random
import time

import anyio

from agentrt import Agent, Engine, SamplingParams, Workflow, task_scope
from agentrt.tools import Tool
from bench.workflow_run import engine_stats, jct_summary, run_at_arrivals
from bench.workflow_workload import _seed
from bench.workloads.agentic import text_of_tokens

NODES = {"planner": ("plan_steps", 0.15, "Split the request into steps."),
         "worker": ("run_step", 0.25, "Carry out one step of the plan."),
         "reviewer": ("check_result", 0.2, "Check the worker's result against the request.")}
WORKFLOW = Workflow.chain("langgraph", *NODES)


def _tool(name: str, latency: float, what: str) -> Tool:
    async def fn(query: str) -> str:
        await anyio.sleep(latency)
        return f"{name}: done ({query[:40]})"

    return Tool.from_function(fn, name=name, description=f"{what} query: what to work on, a few words.")


def _instructions(tok, node: str, n_tokens: int) -> str:
    rng = random.Random(_seed("langgraph", node))
    head = (f"You are the {node} of a three-agent team (planner, worker, reviewer). Always call your tool "
            "first, then answer in one short sentence. ")
    return head + text_of_tokens(tok, n_tokens, rng)


def build_app(rt, tok, prefix_tokens: int, max_tokens: int):
    from langgraph.graph import END, START, MessagesState, StateGraph

    from agentrt.integrations.langgraph import agent_node

    g = StateGraph(MessagesState)
    prev = START
    for node, (tool, latency, what) in NODES.items():
        agent = Agent(node, _instructions(tok, node, prefix_tokens), [_tool(tool, latency, what)],
                      tool_choice="required", max_tool_rounds=1, parallel_tool_calls=False,
                      settings=SamplingParams(max_tokens=max_tokens))
        g.add_node(node, agent_node(agent, rt, output="last_message"))
        g.add_edge(prev, node)
        prev = node
    g.add_edge(prev, END)
    return g.compile()


def questions(tok, n: int, seed: int) -> list[str]:
    out = []
    for i in range(n):
        rng = random.Random(_seed("lg-question", seed, i))
        out.append(f"Request {i}: " + text_of_tokens(tok, rng.randrange(40, 90), rng))
    return out


async def run_langgraph(lm, cfg, arrivals: list[float], prefix_tokens: int, max_tokens: int, seed: int,
                        timeout: float, sequential: bool = False) -> dict:
    from langchain_core.messages import HumanMessage

    from agentrt import Runtime

    qs = questions(lm.tokenizer, len(arrivals), seed)
    jct: dict[str, float] = {}
    async with Engine(lm, cfg) as eng, Runtime(eng) as rt:
        app = build_app(rt, lm.tokenizer, prefix_tokens, max_tokens)
        try:  # the workflow derived from the compiled graph (planner -> worker -> reviewer)
            from agentrt.integrations.langgraph import declare_graph, workflow_of

            source, edges = "declare_graph", dict(workflow_of(app, WORKFLOW.name).edges)
            app = declare_graph(eng, app, WORKFLOW.name)
        except ImportError:  # an adapter without it: the same DAG, declared by hand
            source, edges = "declare_workflow", dict(WORKFLOW.edges)
            eng.declare_workflow(WORKFLOW)

        async def run_task(i: int, start: float) -> None:
            await anyio.sleep(max(0.0, start - time.perf_counter()))
            tid = f"lg-{seed}-{i}"
            with task_scope(tid, workflow=WORKFLOW.name):
                await app.ainvoke({"messages": [HumanMessage(qs[i])]}, {"configurable": {"thread_id": tid}})
            jct[tid] = time.perf_counter() - start
            for node in NODES:
                ref = rt.actors.get(f"{node}/{tid}")
                if ref is not None:
                    await ref.stop()

        wall, timed_out = await run_at_arrivals(run_task, list(range(len(arrivals))), arrivals, timeout, sequential,
                                                clock=time.perf_counter)
        stats = engine_stats(eng)
        await rt.stop_all()
    done = list(jct.values())
    out = {"workflow_source": source, "workflow_edges": edges, "tasks": len(arrivals), "completed": len(done), "timed_out": timed_out, "wall_s": wall,
           "jct_s": done, **jct_summary(done), **stats}
    if len(done) < len(arrivals):
        out["error"] = f"{len(arrivals) - len(done)} of {len(arrivals)} tasks unfinished after {timeout:.0f} s"
    return out
