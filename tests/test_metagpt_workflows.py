"""The MetaGPT workflows of bench/workflows_metagpt.py on real agentrt agents (a tiny random model
with SmolLM2's tokenizer; grammar-forced tool calls): the SOP graph runs the engineer-QA round
as many times as the task's plan says (QA's tool verdict drives the loop), the TL graph's `Send`
fan-out has the planned width and roles, the graphs' DAGs are the declared workflows, and the
simulator's workload follows the same plan: its calls per visit mirror the graph's, and the
recorded graph run replays in the simulator to completion. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

pytest.importorskip("langgraph")

from agentrt import EngineConfig  # noqa: E402
from agentrt.conversation.chat_format import ChatFormat  # noqa: E402
from agentrt.sim import SimExecutor, SimModel, StepCosts  # noqa: E402
from agentrt.sim import run as sim_run  # noqa: E402
from bench.metagpt_graphs import run_graph  # noqa: E402
from bench.metagpt_run import replay_calls, run_plans, script_of  # noqa: E402
from bench.metagpt_workload import TEAM, MetaSizes, make_plans, plan_task, sim_calls  # noqa: E402
from tests.conftest import tiny_native_with_tokenizer  # noqa: E402

SIZES = MetaSizes(prefix_tokens=40, user_tokens=(8, 16), result_tokens=(4, 8), out_tokens=40, tool_dist="const:0.01")
COSTS = Path(__file__).resolve().parents[1] / "bench" / "costs" / "gpu_llama3_8b_h100.json"


@pytest.fixture(scope="module")
def lm():
    return tiny_native_with_tokenizer()


def _run(lm, workflow: str, plans):
    cfg = EngineConfig(response_cache_size=0, kv_tier_bytes=0, enable_speculation=False, scheduling_policy="topas")
    return anyio.run(run_graph, lm, cfg, workflow, plans, SIZES, 300.0)


def _plans(workflow: str, n: int, seed: int, vary):
    plans = make_plans(workflow, SIZES, n, 50.0, seed)
    assert len({vary(p) for p in plans}) > 1, "the seed should give tasks of different shapes"
    return plans


def test_plans_are_a_function_of_the_seed():
    for wf in ("metagpt_sop", "metagpt_tl"):
        a, b = make_plans(wf, SIZES, 4, 1.0, 9), [plan_task(wf, SIZES, 9, i) for i in range(4)]
        assert [p.groups for p in a] == [p.groups for p in b]
    widths = {len(plan_task("metagpt_tl", SIZES, 1, i).groups[1]) for i in range(40)}
    rounds = {len(plan_task("metagpt_sop", SIZES, 1, i).visits_of("qa")) for i in range(40)}
    assert widths == {2, 3, 4} and rounds == {1, 2, 3}


def test_sop_graph_loops_engineer_and_qa_the_planned_rounds(lm):
    plans = _plans("metagpt_sop", 3, 0, lambda p: len(p.visits_of("qa")))
    r = _run(lm, "metagpt_sop", plans)
    assert r["completed"] == 3 and not r.get("error")
    assert r["workflow_edges"]["qa"] == []  # QA's way back to the engineer is not a DAG edge
    for p in plans:
        assert r["visits"][p.task_id] == [v.stage for v in p.visits], p.task_id
        rounds = len(p.visits_of("qa"))
        assert [v.says for v in p.visits_of("qa")] == ["fix"] * (rounds - 1) + ["pass"]
    # every visit made its tool call and its answer: two model calls, replayable
    calls, problems = replay_calls(plans, r["recorder"])
    assert not problems
    for p in plans:
        assert [[len(seq) for seq in g] for g in calls[p.task_id]] == [[2] * len(g) for g in p.groups]


def test_tl_graph_sends_the_planned_team(lm):
    plans = _plans("metagpt_tl", 4, 6, lambda p: len(p.groups[1]))
    r = _run(lm, "metagpt_tl", plans)
    assert r["completed"] == 4 and not r.get("error")
    assert sorted(r["workflow_edges"]["leader"]) == sorted(TEAM)
    for p in plans:
        seen, team = r["visits"][p.task_id], [v.stage for v in p.groups[1]]
        assert seen[0] == "leader" and seen[-1] == "gather", seen
        assert sorted(seen[1:-1]) == sorted(team), (seen, team)  # the fan-out's width and roles
        assert p.groups[0][0].says == "assign: " + ", ".join(team)


def test_the_simulated_workload_follows_the_graphs_plan(lm):
    """The same seeded plan drives the graph and the simulator: sim_calls gives each planned visit
    its two calls (tool call, answer) with the plan's tool latency, and the recorded graph run
    replays in the simulator, every task completing with the graph's number of model calls."""
    fmt = ChatFormat(lm.tokenizer)
    plans = _plans("metagpt_sop", 3, 0, lambda p: len(p.visits_of("qa")))
    for p in plans:
        sim = sim_calls(fmt, lm.tokenizer, p, SIZES)
        assert [[len(seq) for seq in g] for g in sim] == [[2] * len(g) for g in p.groups]
        assert [seq[0].tool_s for g in sim for seq in g] == [v.tool_s for v in p.visits]
    r = _run(lm, "metagpt_sop", plans)
    rec = r["recorder"]
    calls, problems = replay_calls(plans, rec)
    assert not problems
    model = SimModel(lm.model.cfg, lm.model.kv_dtype)
    cfg = EngineConfig(response_cache_size=0, kv_tier_bytes=0, enable_speculation=False, scheduling_policy="topas")
    book = script_of(rec)
    out = sim_run(run_plans, model, fmt, {}, plans, calls, cfg, 1e4, False, SimExecutor(model, StepCosts.load(COSTS), book))
    assert out["completed"] == len(plans) and not out.get("error")
    assert book.synthesized == 0 and book.replayed == len(rec.calls)  # every prompt was the graph's
