"""The MetaGPT workflows as a scripted workload (bench/metagpt_workload.py's plans) for the
simulator, and the recording that lets a simulation replay a real graph run.

`run_plans` drives an engine the way the graphs' agents do: each task starts at its arrival, its
groups in order, the visits of a group concurrently; each stage's agent holds one KV session for
the task (opened at its first visit, tagged with the stage, closed when the task ends, as the
bench stops the task's actors), and a revisit (the engineer after QA says "fix") continues that
session's history. A visit: the tool call, the tool's sleep (the session told to expect it), the
answer. Times are the event loop's, so it runs a real engine or a simulated one (agentrt.sim).

`Recorder` wraps a real engine's `generate` and keeps every call (task, stage, the stage's visit
number, prompt, output, times); `replay_calls` turns a recording into the same per-visit call
lists with the real prompts and output lengths, so the simulator replays what the graph ran."""

from __future__ import annotations

import statistics
from contextlib import AsyncExitStack, aclosing

import anyio

from agentrt import Engine, SamplingParams
from agentrt.workflow import current_task
from bench.metagpt_workload import WORKFLOWS, MetaPlan, SimCall
from bench.workflow_run import busy_time, engine_stats, jct_summary, run_at_arrivals, timed_call


def result_of(plans, jct: dict, intervals: list, ttfts: list, wall: float, timed_out: bool, stats: dict) -> dict:
    done = [jct[p.task_id] for p in plans if p.task_id in jct]
    out = {"tasks": len(plans), "completed": len(done), "timed_out": timed_out, "wall_s": wall,
           "busy_s": busy_time(intervals), "jct_s": done, **jct_summary(done), **stats,
           "turn_s_mean": statistics.fmean(b - a for a, b in intervals) if intervals else None,
           "ttft_s_mean": statistics.fmean(ttfts) if ttfts else None}
    if len(done) < len(plans):
        out["error"] = f"{len(plans) - len(done)} of {len(plans)} tasks unfinished"
    return out


async def run_plans(lm, fmt, prefixes: dict, plans: list[MetaPlan], calls: dict, cfg, timeout: float,
                    sequential: bool = False, executor=None) -> dict:
    """All tasks through one engine built from cfg. `calls`: task id -> per group, per visit,
    its SimCalls (metagpt_workload.sim_calls, or replay_calls); `prefixes`: stage -> static
    prefix ids (used by suffix calls). `sequential`: one task at a time (calibration)."""
    jct: dict[str, float] = {}
    intervals: list[tuple[float, float]] = []
    ttfts: list[float] = []
    async with Engine(lm, cfg, executor=executor) as eng:
        for wf in {p.workflow for p in plans}:
            eng.declare_workflow(WORKFLOWS[wf])

        async def visit(plan: MetaPlan, stage: str, seq: list[SimCall], agents: dict, stack) -> None:
            if stage not in agents:
                s = await stack.enter_async_context(await eng.open_session(tag=stage))
                agents[stage] = [s, list(prefixes.get(stage, ()))]
            s, prompt = agents[stage]
            for k, call in enumerate(seq):
                prompt = list(call.prompt) if call.prompt is not None else prompt + call.suffix
                sp = SamplingParams(max_tokens=max(call.max_tokens, 1), ignore_eos=True)
                t0 = anyio.current_time()
                out, ttft = await timed_call(eng, prompt, sp, session=s, tag=stage, task=plan.task_id,
                                             workflow=plan.workflow)
                intervals.append((t0, anyio.current_time()))
                ttfts.append(ttft)
                prompt = prompt + fmt.encode_assistant_tokens(out)
                if k < len(seq) - 1:  # the tool the call asked for
                    await s.expect_tools([stage])
                    await anyio.sleep(call.tool_s)
            agents[stage][1] = prompt

        async def run_task(plan: MetaPlan, start: float) -> None:
            await anyio.sleep(max(0.0, start - anyio.current_time()))
            agents: dict = {}
            async with AsyncExitStack() as stack:
                for group, group_calls in zip(plan.groups, calls[plan.task_id]):
                    async with anyio.create_task_group() as tg:
                        for v, seq in zip(group, group_calls):
                            tg.start_soon(visit, plan, v.stage, seq, agents, stack)
            jct[plan.task_id] = anyio.current_time() - start

        wall, timed_out = await run_at_arrivals(run_task, plans, [p.arrival for p in plans], timeout, sequential)
        stats = engine_stats(eng)
    return result_of(plans, jct, intervals, ttfts, wall, timed_out, stats)


class Recorder:
    """Every model call a real engine runs (installed over `engine.generate`): its task and stage,
    which visit of that stage in the task it belongs to (`entered`: bumped by the graph's node
    wrappers as a visit starts), its prompt and output, and when it ran."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.entered: dict[tuple[str, str], int] = {}  # (task, stage) -> visits started
        self.log: list[tuple[str, str]] = []  # (task, stage) per visit, in the order they started

    def enter(self, task: str, stage: str) -> int:
        k = self.entered[(task, stage)] = self.entered.get((task, stage), 0) + 1
        self.log.append((task, stage))
        return k

    def install(self, eng) -> None:
        inner = eng.generate

        async def generate(prompt, params=None, **kw):
            ctx = current_task()
            task = kw.get("task") or (ctx.task_id if ctx else None)
            stage = kw.get("tag") or (kw["session"].engine_session.tag if kw.get("session") else None)
            rec = {"task": task, "stage": stage, "visit": self.entered.get((task, stage), 0), "prompt": list(prompt),
                   "out": [], "t0": anyio.current_time(), "ttft": None}
            async with aclosing(inner(prompt, params, **kw)) as events:
                async for ev in events:
                    if rec["ttft"] is None and ev.token_ids:
                        rec["ttft"] = anyio.current_time() - rec["t0"]
                    rec["out"].extend(ev.token_ids)
                    yield ev
            rec["t1"] = anyio.current_time()
            self.calls.append(rec)

        eng.generate = generate

    def intervals(self) -> list[tuple[float, float]]:
        return [(c["t0"], c["t1"]) for c in self.calls]


def replay_calls(plans: list[MetaPlan], rec: Recorder) -> tuple[dict, list[str]]:
    """task id -> per group, per visit, the recorded calls of that visit (whole prompts, the
    output's length, the plan's tool latency after every call but the last), and the problems
    found (a visit that made no call: it gets none)."""
    by: dict[tuple, list[dict]] = {}
    for c in sorted(rec.calls, key=lambda c: c["t0"]):
        by.setdefault((c["task"], c["stage"], c["visit"]), []).append(c)
    out, problems = {}, []
    for plan in plans:
        seen: dict[str, int] = {}
        groups = []
        for g in plan.groups:
            row = []
            for v in g:
                k = seen[v.stage] = seen.get(v.stage, 0) + 1
                got = by.get((plan.task_id, v.stage, k), [])
                if not got:
                    problems.append(f"{plan.task_id} {v.stage} visit {k}: no call recorded")
                row.append([SimCall(prompt=c["prompt"], tool_s=v.tool_s, max_tokens=len(c["out"])) for c in got])
            groups.append(row)
        out[plan.task_id] = groups
    return out, problems


def script_of(rec: Recorder):
    """The recording as the simulator's ScriptBook (each prompt's recorded output)."""
    from agentrt.sim import ScriptBook

    book = ScriptBook()
    for c in rec.calls:
        book.record(c["prompt"], c["out"])
    return book
