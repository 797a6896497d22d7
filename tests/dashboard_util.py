"""A running 3-agent workload for the dashboard tests: a tiny random-weight model, a Runtime with
three tool-calling agents, a declared pipeline workflow, and a background thread asking the
agents in rounds until stopped (the dashboard served from it)."""

from __future__ import annotations

import queue
import threading
from typing import Literal

import anyio

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, Workflow, dashboard, task_scope, tool
from tests.conftest import tiny_native_with_tokenizer

AGENTS = ("planner", "coder", "reviewer")
CFG = EngineConfig(kv_cache_tokens=4096)


@tool
async def lookup(topic: Literal["kv", "tools"]) -> str:
    """Look a topic up."""
    await anyio.sleep(0.02)
    return f"{topic}: ok"


class Workload:
    """`with Workload() as w:` -> w.url (the dashboard), w.turns (turns finished so far)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._ready: queue.Queue = queue.Queue()
        self.turns = 0
        self._thread = threading.Thread(target=lambda: anyio.run(self._main), name="dashboard-workload", daemon=True)

    def __enter__(self) -> "Workload":
        self._thread.start()
        got = self._ready.get(timeout=120)
        if isinstance(got, BaseException):
            raise got
        self.url = got
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _main(self) -> None:
        try:
            async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
                eng.declare_workflow(Workflow.chain("pipeline", *AGENTS))
                refs = [await rt.spawn(Agent(name, f"You are the {name}.", [lookup], tool_choice="required",
                                             max_tool_rounds=1, settings=SamplingParams(max_tokens=40)), name=name)
                        for name in AGENTS]
                with dashboard.serve(rt, port=0, interval=0.2) as board:
                    self._ready.put(board.url)
                    await self._loop(refs)
        except BaseException as e:  # (the test thread hears of it)
            self._ready.put(e)
            raise

    async def _loop(self, refs, rounds: int = 12) -> None:
        """`rounds` of two tasks through the pipeline at once, paced (the conversations stay
        well inside the KV pool), then idle until stopped."""
        for i in range(rounds):
            if self._stop.is_set():
                return
            async with anyio.create_task_group() as tg:
                for j in range(2):
                    tg.start_soon(self._pipeline, refs, f"job-{i}-{j}")
            await anyio.sleep(0.3)
        while not self._stop.is_set():
            await anyio.sleep(0.05)

    async def _pipeline(self, refs, task: str) -> None:
        with task_scope(task, workflow="pipeline"):
            for ref in refs:
                await ref.ask("next step", timeout=60)
                self.turns += 1
