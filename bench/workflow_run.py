"""Running one workload through one scheduling policy (bench_workflows.py): a fresh engine per
run, tasks started at their arrival times, each stage after its predecessors; JCT per task =
completion of its last stage - its arrival. Times come from the event loop's clock, so the same
driver runs a real engine or a simulated one (bench_sim.py: agentrt.sim on a virtual clock)."""

from __future__ import annotations

import statistics
import time
from contextlib import aclosing

import anyio
import numpy as np

from agentrt import Engine, SamplingParams
from agentrt.sim import ScriptBook, SimExecutor, SimModel
from agentrt.sim import run as sim_run
from bench.workflow_workload import Dag, Sizes, TaskPlan

# what a simulated run is compared with its measured run on (sim / real): mean JCT, per-turn
# latency, TTFT, hit rate, the engine's step seconds
SIM_METRICS = ("mean_jct_s", "turn_s_mean", "ttft_s_mean", "hit_rate", "step_s")


def jct_summary(jcts: list[float]) -> dict:
    if not jcts:
        return {"mean_jct_s": None, "p50_jct_s": None, "p99_jct_s": None}
    a = np.asarray(jcts)
    return {"mean_jct_s": float(a.mean()), "p50_jct_s": float(np.percentile(a, 50)),
            "p99_jct_s": float(np.percentile(a, 99))}


def engine_stats(eng) -> dict:
    st = eng.stats()
    dec = getattr(st, "decision_us_p50", None)
    return {"hit_rate": st.hit_rate, "prompt_submitted": st.prompt_submitted, "prompt_computed": st.prompt_computed,
            "decode_tokens": st.decode_tokens, "steps": st.steps, "step_s": st.step_seconds, "preemptions": st.preemptions,
            "admissions": st.admissions,
            "evicted_pages": st.evicted_pages, "decision_us_p50": dec}


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (time with at least one model call in flight)."""
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


async def timed_call(eng, prompt: list[int], sp, **kw) -> tuple[list[int], float]:
    """One streamed model call: (output ids, seconds to its first token)."""
    t0, ttft, out = anyio.current_time(), None, []
    async with aclosing(eng.generate(prompt, sp, **kw)) as stream:
        async for ev in stream:
            if ttft is None and ev.token_ids:
                ttft = anyio.current_time() - t0
            out.extend(ev.token_ids)
    return out, ttft if ttft is not None else anyio.current_time() - t0


async def run_at_arrivals(run_task, tasks: list, arrivals: list[float], timeout: float, sequential: bool = False,
                          clock=anyio.current_time) -> tuple[float, bool]:
    """`run_task(task, start)` for every task: each started at t0 + its arrival, side by side, or
    (`sequential`, a calibration) one after another; under `timeout`. Returns (wall seconds,
    whether the timeout cut it). `clock`: the time the tasks' starts are on."""
    t0 = clock()
    with anyio.move_on_after(timeout) as scope:
        if sequential:
            for task in tasks:
                await run_task(task, clock())
        else:
            async with anyio.create_task_group() as tg:
                for task, arrival in zip(tasks, arrivals):
                    tg.start_soon(run_task, task, t0 + arrival)
    return clock() - t0, scope.cancelled_caught


async def run_dag(lm, fmt, dag: Dag, tasks: list[TaskPlan], sizes: Sizes, cfg, timeout: float,
                  sequential: bool = False, executor=None, book=None, on_close=None) -> dict:
    """All tasks through one engine built from cfg; `sequential`: one task at a time (calibration).
    `executor`: a simulated one (agentrt.sim; run under agentrt.sim.run); `book`: a ScriptBook
    that records every call's output (a real run, for a simulation to replay); `on_close(engine)`:
    awaited after the last task, before the engine closes (bench/workflow_trace.py takes its trace)."""
    sp = SamplingParams(max_tokens=sizes.out_tokens, ignore_eos=True)
    jct: dict[str, float] = {}
    intervals: list[tuple[float, float]] = []
    ttfts: list[float] = []
    async with Engine(lm, cfg, executor=executor) as eng:
        eng.declare_workflow(dag.workflow)

        async def stage(task: TaskPlan, s: str, done: dict) -> None:
            for p in dag.preds[s]:
                await done[p].wait()
            prompt = list(dag.prefixes[s])
            calls = task.stages[s].calls
            for k, call in enumerate(calls):
                prompt += call.suffix
                t = anyio.current_time()
                out, ttft = await timed_call(eng, prompt, sp, tag=s, task=task.task_id, workflow=dag.name)
                intervals.append((t, anyio.current_time()))
                ttfts.append(ttft)
                if book is not None:
                    book.record(prompt, out)
                prompt += fmt.encode_assistant_tokens(out)
                if k < len(calls) - 1 or len(calls) == 1:  # the tool the call asked for
                    await anyio.sleep(call.tool_s)
            done[s].set()

        async def run_task(task: TaskPlan, start: float) -> None:
            await anyio.sleep(max(0.0, start - anyio.current_time()))
            done = {s: anyio.Event() for s in dag.preds}
            async with anyio.create_task_group() as tg:
                for s in dag.order:
                    tg.start_soon(stage, task, s, done)
            jct[task.task_id] = anyio.current_time() - start

        wall, timed_out = await run_at_arrivals(run_task, tasks, [t.arrival for t in tasks], timeout, sequential)
        stats = engine_stats(eng)
        if on_close is not None:
            await on_close(eng)
    done = [jct[t.task_id] for t in tasks if t.task_id in jct]
    out = {"tasks": len(tasks), "completed": len(done), "timed_out": timed_out,
           "wall_s": wall, "busy_s": busy_time(intervals), "jct_s": done, **jct_summary(done), **stats,
           "turn_s_mean": statistics.fmean(b - a for a, b in intervals) if intervals else None,
           "ttft_s_mean": statistics.fmean(ttfts) if ttfts else None}
    if len(done) < len(tasks):
        out["error"] = f"{len(tasks) - len(done)} of {len(tasks)} tasks unfinished after {timeout:.0f} s"
    return out


def reductions(policies: dict, target: str = "topas") -> dict:
    """1 - target / best baseline, for mean and p99 JCT (None when a side did not run)."""
    out = {}
    for q in ("mean", "p99"):
        key = f"{q}_jct_s"
        base = {p: r[key] for p, r in policies.items() if p != target and r.get(key) is not None
                and not r.get("error")}
        t = policies.get(target, {})
        if base and t.get(key) is not None and not t.get("error"):
            best = min(base, key=base.get)
            out[f"{q}_jct_reduction_vs_best_baseline"] = 1.0 - t[key] / base[best]
            out[f"{q}_best_baseline"] = best
        else:
            out[f"{q}_jct_reduction_vs_best_baseline"] = None
            out[f"{q}_best_baseline"] = None
    return out


def combine_reps(reps: list[dict]) -> dict:
    """Repetitions of one policy (paired: repetition k has the same tasks and arrivals for every
    policy) -> one result: the median over repetitions of each JCT figure (this machine has slow
    phases: a median is robust to one), hit rate and prompt tokens averaged, every repetition kept."""
    ok = [r for r in reps if not r.get("error")]
    out: dict = {"reps": reps, "tasks": sum(r.get("tasks", 0) for r in reps),
                 "completed": sum(r.get("completed", 0) for r in reps)}
    if len(ok) < len(reps):
        out["error"] = "; ".join(r["error"] for r in reps if r.get("error"))
    for key in ("mean_jct_s", "p50_jct_s", "p99_jct_s", "decision_us_p50", "wall_s"):
        out[key] = median_or_none(r.get(key) for r in ok)
    for key in ("hit_rate", "prompt_computed", "prompt_submitted", "preemptions"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    out["jct_s"] = [x for r in ok for x in r.get("jct_s", [])]
    return out


# two-sided 95% Student t quantiles by degrees of freedom (n - 1 paired repetitions)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def paired_summary(per: list[float]) -> dict:
    """TOPAS's reduction per paired repetition -> its spread (max - min), mean, the 95% t-interval
    of the mean, and how many repetitions it led in. A gain is beyond the spread of the paired
    repetitions when the interval's low end is above zero (and, with few repetitions, when it led
    in every one: a sign test)."""
    out: dict = {"per_rep": per, "reps": len(per), "led_in": sum(x > 0 for x in per)}
    if not per:
        return out
    mean = statistics.fmean(per)
    out.update(mean=mean, min=min(per), max=max(per), spread=max(per) - min(per) if len(per) > 1 else None)
    if len(per) > 1:
        half = T95.get(len(per) - 1, 1.96) * statistics.stdev(per) / len(per) ** 0.5
        out["ci95"] = [mean - half, mean + half]
        out["beyond_spread"] = mean - half > 0
    return out


def per_rep_keys(per: list) -> dict:
    """The keys both workflow benches report for TOPAS's reduction per paired repetition (None:
    a repetition where a side did not run): the reductions, their spread and paired_summary."""
    per = [x for x in per if x is not None]
    paired = paired_summary(per)
    return {"mean_jct_reduction_per_rep": per, "mean_jct_reduction_spread": paired.get("spread"),
            "mean_jct_reduction_paired": paired}


def median_or_none(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def measured_and_simulated(lm, fmt, dag: Dag, tasks: list[TaskPlan], sizes: Sizes, cfg, costs, reps: int = 1,
                           timeout: float = 600.0) -> dict:
    """One policy on one task set, run for real `reps` times (the first run's outputs recorded),
    then simulated on `costs` with the recording replayed, so the simulation sees every prompt the
    real run did: {"real", "sim", "sim_over_real" per SIM_METRICS}; real figures are means over
    the runs, with their mean-JCT spread."""
    book = ScriptBook()
    runs = [anyio.run(run_dag, lm, fmt, dag, tasks, sizes, cfg, timeout, False, None, book if i == 0 else None)
            for i in range(reps)]
    real = {k: statistics.fmean(r[k] for r in runs) if all(isinstance(r.get(k), (int, float)) for r in runs)
            else runs[0].get(k) for k in runs[0]}
    jcts = [r["mean_jct_s"] for r in runs if r.get("mean_jct_s")]
    real["spread"] = (max(jcts) - min(jcts)) / statistics.fmean(jcts) if len(jcts) > 1 else 0.0
    model = SimModel(lm.model.cfg, lm.model.kv_dtype)
    t0 = time.perf_counter()
    sim = sim_run(run_dag, model, fmt, dag, tasks, sizes, cfg, timeout, False, SimExecutor(model, costs, book))
    sim["sim_wall_s"] = time.perf_counter() - t0
    keep = ("mean_jct_s", "p99_jct_s", "turn_s_mean", "ttft_s_mean", "hit_rate", "step_s", "prompt_computed", "steps",
            "preemptions", "wall_s", "sim_wall_s", "error", "spread")
    ratio = {m: sim[m] / real[m] if real.get(m) and sim.get(m) is not None else None for m in SIM_METRICS}
    return {"real": {k: real.get(k) for k in keep}, "sim": {k: sim.get(k) for k in keep}, "sim_over_real": ratio}
