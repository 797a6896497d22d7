"""Synthetic workflow DAGs for bench_workflows.py (issue 15, seed 004's setup).

Three DAGs: `chain` A->B->C, `fanout` A->{B1,B2,B3}->D (the B stages run concurrently) and
`diamond` A->{B,C}->D. Every stage is an agent with its own long static prefix (system prompt +
tool schemas, ~`prefix_tokens`); a stage makes 1-2 tool-calling model calls: the first prompt is
the prefix + a task-specific user message (50-120 tokens), the second extends the first with its
output and a tool result (30-60 tokens); a simulated tool (sleep 0.1-0.3 s, or heavy-tailed: `Sizes.tool_dist`) runs after each call.
Outputs are forced to `out_tokens` (ignore_eos), so every policy does the same work. Tasks
arrive as a Poisson process. Seeded: the same tasks, token ids and arrival times for every policy.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass

from agentrt import Workflow
from bench.workloads.agentic import text_of_tokens, tool_schemas
from bench.workloads.latency import LatencyDist, tool_scale

DAG_EDGES = {
    "chain": [("A", "B"), ("B", "C")],
    "fanout": [("A", "B1"), ("A", "B2"), ("A", "B3"), ("B1", "D"), ("B2", "D"), ("B3", "D")],
    "diamond": [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")],
}
DAGS = tuple(DAG_EDGES)


@dataclass(frozen=True)
class Sizes:
    prefix_tokens: int = 900  # per agent: system prompt + tool schemas
    user_tokens: tuple[int, int] = (50, 121)  # task-specific message, uniform in [lo, hi)
    result_tokens: tuple[int, int] = (30, 61)  # tool result fed to the second call
    out_tokens: int = 16  # forced output per call
    calls: tuple[int, int] = (1, 2)  # model calls per stage, uniform in [lo, hi]
    tool_s: tuple[float, float] = (0.1, 0.3)  # simulated tool latency, uniform
    # a heavy-tailed alternative: a bench/workloads/latency.py spec ("lognormal:MEDIAN:SIGMA"),
    # scaled per stage (each stage's tools have their own typical time); "" = uniform tool_s
    tool_dist: str = ""

    def tool_latency(self, rng: random.Random, stage: str) -> float:
        if not self.tool_dist:
            return rng.uniform(*self.tool_s)
        return LatencyDist.parse(self.tool_dist).draw(rng, tool_scale(stage))


@dataclass
class Call:
    suffix: list[int]  # ids after the previous call's prompt + output (the first: after the prefix)
    tool_s: float  # tool latency after this call


@dataclass
class StagePlan:
    stage: str
    calls: list[Call]


@dataclass
class TaskPlan:
    task_id: str
    arrival: float  # seconds after the run's start
    stages: dict[str, StagePlan]


@dataclass
class Dag:
    name: str
    workflow: Workflow
    preds: dict[str, list[str]]  # stage -> the stages that must finish first
    prefixes: dict[str, list[int]]  # stage -> its agent's static prefix ids

    @property
    def order(self) -> list[str]:
        """Stages in a topological order."""
        out: list[str] = []
        while len(out) < len(self.preds):
            out += [s for s, p in self.preds.items() if s not in out and all(x in out for x in p)]
        return out


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def make_dag(fmt, tok, name: str, sizes: Sizes) -> Dag:
    edges = DAG_EDGES[name]
    wf = Workflow.from_edges(name, edges)
    preds = {s: [a for a, b in edges if b == s] for s in wf.stages}
    prefixes = {}
    for s in wf.stages:
        head = f"You are agent {s} of the {name} workflow. Use the tools to finish your part of the task. "
        for n_tools in range(6, 0, -1):  # tool schemas take at most ~60% of the prefix, prose the rest
            rng = random.Random(_seed("prefix", name, s))
            tools = tool_schemas(n_tools, rng)
            base = len(fmt.encode([{"role": "system", "content": head}], tools=tools, add_generation_prompt=False))
            if base <= 0.6 * sizes.prefix_tokens:
                break
        system = head + text_of_tokens(tok, max(sizes.prefix_tokens - base, 8), rng)
        prefixes[s] = fmt.encode([{"role": "system", "content": system}], tools=tools,
                                 add_generation_prompt=False)
    return Dag(name, wf, preds, prefixes)


def make_tasks(fmt, tok, dag: Dag, sizes: Sizes, n: int, rate: float, seed: int) -> list[TaskPlan]:
    """n tasks with Poisson arrivals at `rate` tasks/s (the first at 0); per stage its calls. The
    arrivals are one seeded unit-rate pattern scaled by 1 / rate, and the tasks' contents depend on
    the seed alone: two load levels differ only in how close the same tasks arrive."""
    arr_rng = random.Random(_seed("arrivals", dag.name, seed))
    t, tasks = 0.0, []
    sys_msg = [{"role": "system", "content": "x"}]  # (deltas do not depend on the system text)
    for i in range(n):
        if i:
            t += arr_rng.expovariate(1.0) / rate
        stages = {}
        for s in dag.workflow.stages:
            rng = random.Random(_seed("task", dag.name, seed, i, s))
            user = {"role": "user", "content": f"Task {i}: " + text_of_tokens(tok, rng.randrange(*sizes.user_tokens), rng)}
            calls = [Call(fmt.encode_delta(sys_msg, [user]), sizes.tool_latency(rng, s))]
            prev = sys_msg + [user, {"role": "assistant", "content": "ok"}]
            for k in range(1, rng.randint(*sizes.calls)):
                body = text_of_tokens(tok, rng.randrange(*sizes.result_tokens), rng)
                msg = {"role": "tool", "content": json.dumps({"result": body}), "tool_call_id": f"call_{k}"}
                calls.append(Call(fmt.encode_delta(prev, [msg]), sizes.tool_latency(rng, s)))
                prev = prev + [msg, {"role": "assistant", "content": "ok"}]
            stages[s] = StagePlan(s, calls)
        tasks.append(TaskPlan(f"{dag.name}-{seed}-{i}", t, stages))
    return tasks


def task_tokens(dag: Dag, tasks: list[TaskPlan], sizes: Sizes) -> dict:
    """Sizes of the work: mean prompt tokens per call, calls per task."""
    calls = [c for t in tasks for st in t.stages.values() for c in st.calls]
    return {"calls_per_task": len(calls) / max(len(tasks), 1),
            "prefix_tokens": {s: len(p) for s, p in dag.prefixes.items()},
            "suffix_tokens_mean": sum(len(c.suffix) for c in calls) / max(len(calls), 1),
            "out_tokens": sizes.out_tokens}
