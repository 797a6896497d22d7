"""`agentrt dashboard`: a small multi-agent workload on an in-process engine, with the live
dashboard (agentrt.dashboard) served beside it. Tasks go through a pipeline of agents (a declared
workflow), two at a time; each agent must call its tool (a lookup that takes a few ms) and then
answers. Ctrl-C stops it. For your own program, call `agentrt.dashboard.serve(runtime)`."""

from __future__ import annotations

import itertools
import sys
from typing import Literal

import anyio

from agentrt.errors import ConfigError

STAGES = ("planner", "coder", "reviewer", "tester", "writer", "editor", "critic", "publisher")


def _lookup_tool():
    from agentrt import tool

    @tool
    async def lookup(topic: Literal["kv cache", "tools", "scheduling"]) -> str:
        """Look a topic up in the team's notes."""
        await anyio.sleep(0.05)
        return f"notes on {topic}: fine"

    return lookup


def check_args(args) -> None:
    if not 1 <= args.agents <= len(STAGES):
        raise ConfigError(f"--agents must be in 1..{len(STAGES)}, got {args.agents}")
    if args.tasks < 0:
        raise ConfigError(f"--tasks must be >= 0 (0: until Ctrl-C), got {args.tasks}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0: any free port), got {args.port}")


async def run(model, engine_config, args) -> None:
    from agentrt import Agent, Engine, Runtime, SamplingParams, Workflow, dashboard

    check_args(args)
    stages, lookup = STAGES[:args.agents], _lookup_tool()
    async with Engine(model, engine_config) as engine, Runtime(engine) as rt:
        engine.declare_workflow(Workflow.chain("pipeline", *stages))
        refs = [await rt.spawn(Agent(s, f"You are the {s} of a small team. Look things up, then answer briefly.",
                                     [lookup], tool_choice="required", max_tool_rounds=1,
                                     settings=SamplingParams(max_tokens=64)), name=s) for s in stages]
        with dashboard.serve(rt, host=args.host, port=args.port) as board:
            print(f"agentrt: dashboard on {board.url} (Ctrl-C stops)", file=sys.stderr)
            await _work(refs, args.tasks)
            print(f"agentrt: {args.tasks} tasks done; the dashboard stays up (Ctrl-C stops)", file=sys.stderr)
            await anyio.sleep_forever()


async def _work(refs, tasks: int) -> None:
    """`tasks` tasks through the pipeline, two at a time (0: for ever; the agents' conversations
    drop their oldest turns once they would outgrow the context: ContextPolicy "trim")."""
    from agentrt import task_scope

    count = itertools.count(1) if tasks == 0 else iter(range(1, tasks + 1))

    async def one(n: int) -> None:
        with task_scope(f"task-{n}", workflow="pipeline"):
            for ref in refs:
                await ref.ask(f"Task {n}: do your part.", timeout=300)

    for n in count:
        async with anyio.create_task_group() as tg:
            tg.start_soon(one, n)
            if tasks == 0 or n < tasks:
                tg.start_soon(one, next(count))
        await anyio.sleep(0.2)
