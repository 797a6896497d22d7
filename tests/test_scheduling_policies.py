"""Scheduling policies (scheduling/policies.py, scheduling/topas.py) on hand-built views where the right
decision is known, TOPAS's aging bound under adversarial arrivals, and the workflow facts
(agentrt.Workflow, scheduling/tasks.py) they rest on."""

from __future__ import annotations

import pytest

from agentrt import Workflow, task_scope
from agentrt.errors import ConfigError
from agentrt.scheduling.policies import SCHEDULING_POLICIES, Ready, SchedulingView, make_scheduling_policy
from agentrt.scheduling.tasks import TaskTracker
from agentrt.scheduling.topas import Topas

PREFIX = 1000  # tokens of every agent's static prefix
RELOAD = 1e-3  # seconds to recompute one prefix token: a prefix move costs 1 s
COST = 0.3  # seconds of one request's own service


def ready(name, stage, *, remaining, task_arrival=0.0, arrival=0.0, resident=0, successors=()):
    return Ready(name, stage, f"t-{name}", arrival, task_arrival, resident, 100, remaining, COST, successors, 100)



def test_every_configurable_policy_name_builds_that_policy():
    """The names EngineConfig accepts (agentrt/policy_names.py) and the factories agree."""
    from agentrt import EngineConfig
    from agentrt.kv.registry import make_policy
    from agentrt.policy_names import EVICTION_POLICIES

    for name in EVICTION_POLICIES:
        assert make_policy(name).name == name and EngineConfig(eviction_policy=name).eviction_policy == name
    for name in SCHEDULING_POLICIES:
        assert make_scheduling_policy(name).name == name and EngineConfig(scheduling_policy=name)
    for make in (make_policy, make_scheduling_policy):
        with pytest.raises(ConfigError, match="unknown"):
            make("nope")

def view(ready_list, *, resident=None, running=(), budget=1500, now=0.0):
    resident = resident or {}
    stages = {s for r in [*ready_list, *running] for s in (r.stage, *r.successors)} | set(resident)
    return SchedulingView(list(ready_list), list(running), {a: PREFIX for a in stages},
                          {a: resident.get(a, 0) for a in stages}, budget, RELOAD, now)


def chain_ready():
    """The seed's A -> B -> C with A's prefix resident: requests of each stage, oldest last."""
    return [ready("a1", "A", remaining=0.9, arrival=3, task_arrival=3, resident=PREFIX),
            ready("b1", "B", remaining=0.6, arrival=2, task_arrival=1),
            ready("c1", "C", remaining=0.3, arrival=1, task_arrival=0)]


def test_baseline_orders():
    rs = chain_ready()
    v = view(rs, resident={"A": PREFIX})
    assert make_scheduling_policy("fcfs").decide(v).order == ["a1", "b1", "c1"]
    assert make_scheduling_policy("lpm").decide(v).order[0] == "a1"  # locality first
    assert make_scheduling_policy("srpt").decide(v).order == ["c1", "b1", "a1"]  # least work left first
    assert make_scheduling_policy("program_fcfs").decide(v).order == ["c1", "b1", "a1"]  # oldest task first
    for name in SCHEDULING_POLICIES[:4]:
        assert make_scheduling_policy(name).decide(v).keep is None


def test_topas_batches_the_resident_prefix_instead_of_thrashing():
    """Three ready requests share the resident prefix A; one B request of an older task needs a
    1 s reload that would evict A (the budget holds one prefix). SRPT would switch to B; TOPAS
    serves the A batch and keeps A resident."""
    rs = [ready(f"a{i}", "A", remaining=0.9, resident=PREFIX) for i in range(3)]
    rs.append(ready("b1", "B", remaining=0.6, task_arrival=-1.0))
    d = Topas().decide(view(rs, resident={"A": PREFIX}))
    assert sorted(d.order) == ["a0", "a1", "a2"] and d.keep == frozenset({"A"})
    assert make_scheduling_policy("srpt").decide(view(rs, resident={"A": PREFIX})).order[0] == "b1"


def test_topas_fills_a_chosen_agent_by_resident_match_first():
    """Inside the agent set it chose, TOPAS admits the longest resident match first (LPM's
    locality), even before a heavier request (a task nearer its end) with nothing resident, when
    the budget holds only some of them: filling by weight mixed stages and lost the cache hits."""
    cold = ready("a_cold", "A", remaining=0.1, resident=0)  # the highest weight, nothing resident
    warm = [ready(f"a_warm{i}", "A", remaining=0.9, resident=PREFIX + 50 * i) for i in range(3)]
    d = Topas().decide(view([cold, *warm], resident={"A": PREFIX}, budget=PREFIX + 300))
    assert d.order[:3] == ["a_warm2", "a_warm1", "a_warm0"]
    assert "a_cold" not in d.order  # (no room left for it this round)


def test_topas_moves_to_the_downstream_stage_when_it_pays():
    """Locality-first (LPM) would stay at the entry stage A; with six old tasks waiting at their
    last stage C, TOPAS moves the budget to C's prefix."""
    rs = [ready("a1", "A", remaining=0.9, resident=PREFIX, task_arrival=50.0)]
    rs += [ready(f"c{i}", "C", remaining=0.3, task_arrival=0.0) for i in range(6)]
    v = view(rs, resident={"A": PREFIX}, budget=2000, now=60.0)
    d = Topas().decide(v)
    assert d.order and all(x.startswith("c") for x in d.order) and "C" in d.keep
    assert make_scheduling_policy("lpm").decide(v).order[0] == "a1"


def test_topas_charges_a_move_for_the_batch_it_could_have_served():
    """Nothing resident, the budget holds one prefix and five requests beside it: one request of
    a task at its last stage (the highest weight) against three of the entry stage. A move
    charged once would bring D's prefix in for its one request, and the A requests behind it
    would pay a second move; charged as the full batch it amortizes (5 / k reloads), A's three go."""
    rs = [ready("d1", "D", remaining=0.3, task_arrival=0.0)]
    rs += [ready(f"a{i}", "A", remaining=0.9, task_arrival=0.0) for i in range(3)]
    d = Topas().decide(view(rs, budget=PREFIX + 500))
    assert sorted(d.order) == ["a0", "a1", "a2"] and "A" in d.keep and "D" not in d.keep
    # five D requests fill the batch: the move is charged once, and the task-ending stage wins
    rs += [ready(f"d{i}", "D", remaining=0.3, task_arrival=0.0) for i in range(2, 6)]
    d = Topas().decide(view(rs, budget=PREFIX + 500))
    assert d.order and all(x.startswith("d") for x in d.order)


def test_topas_keeps_a_running_agents_prefix_and_looks_ahead():
    """A running request of stage A leads to B next: B's resident prefix is kept (lookahead)
    while an unrelated resident prefix X is not."""
    run = ready("a0", "A", remaining=0.9, resident=PREFIX, successors=("B",))
    d = Topas().decide(view([ready("a1", "A", remaining=0.9, resident=PREFIX)], running=[run],
                            resident={"A": PREFIX, "B": PREFIX, "X": PREFIX}, budget=4000))
    assert d.order == ["a1"] and {"A", "B"} <= d.keep and "X" not in d.keep


def test_topas_idle_engine_always_admits():
    """Nothing running, the only ready request needs a reload worth more than it: admitted anyway."""
    d = Topas().decide(view([ready("b1", "B", remaining=5.0)], budget=500))
    assert d.order == ["b1"]


def test_topas_aging_bounds_waiting_under_adversarial_arrivals():
    """A new entry-stage task arrives at every scheduling point and A stays resident: without
    aging TOPAS would batch A forever. A waiting B request is admitted within a bounded time,
    and sooner with a shorter aging constant."""
    def waited(aging_s: float) -> float:
        topas, now = Topas(aging_s=aging_s), 0.0
        b = ready("b", "B", remaining=0.6, task_arrival=0.0)
        while now < 1000:
            rs = [ready(f"a{now}", "A", remaining=0.9, resident=PREFIX, task_arrival=now, arrival=now), b]
            d = topas.decide(view(rs, resident={"A": PREFIX}, budget=1500, now=now))
            if "b" in d.order:
                return now
            now += COST  # one A request served per scheduling point
        return float("inf")

    # B wins once its aged weight pays for its move (charged for the 5 requests that fit beside
    # B's prefix: it brings one), A's eviction and its own work:
    # (1 + age / aging_s) / 0.6 * COST / ((5 + 1) * PREFIX * RELOAD + 100 * RELOAD) > A's density
    density_a = (1 / 0.9) * COST / (100 * RELOAD)
    full = (1500 - PREFIX) // 100
    def bound(aging_s):
        return aging_s * (density_a * 0.6 * ((full + 1) * PREFIX + 100) * RELOAD / COST - 1)
    slow, fast = waited(10.0), waited(1.0)
    assert fast < slow <= bound(10.0) + COST and fast <= bound(1.0) + COST
    assert waited(1e9) == float("inf")  # without aging, B would wait forever


def test_topas_search_greedy_beyond_exhaustive():
    rs = [ready(f"r{i}", f"S{i}", remaining=1.0 + i) for i in range(9)]
    v = view(rs, budget=10_000)
    exhaustive, greedy = Topas(exhaustive_agents=9).decide(v), Topas(exhaustive_agents=3).decide(v)
    assert greedy.order and set(greedy.order) <= set(exhaustive.order) | set(greedy.order)
    assert len(greedy.keep) >= 1


def test_workflow_dag_and_learned_transitions():
    wf = Workflow.from_edges("diamond", [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")])
    assert wf.entries == ("A",) and wf.longest_path("A", {"B": 3.0}) == 5.0
    with pytest.raises(ConfigError, match="cycle"):
        Workflow.chain("loop", "A", "B", "A")
    with pytest.raises(ConfigError):
        Workflow("x", {"A": (7,)})
    tr = TaskTracker()
    for task in ("t1", "t2"):
        for stage in ("plan", "code", "plan", "review"):  # a revisit does not close a cycle
            tr.observe(task, None, stage, 0.0, [1, 2, 3, 10 + int(task[1:])], None)  # (4th token differs)
    learned = tr.workflow_of("t1")
    assert "code" in learned.successors("plan") and "review" in learned.successors("code") + learned.successors("plan")
    assert tr.prefix_len("plan") == 3  # the tokens all its prompts began with
    tr.served("code", 2.0)
    assert tr.remaining("t1", "code") >= 2.0
    tr.declare(Workflow.chain("rev", "plan", "code", "review", cost={"review": 4.0}))
    tr.observe("t3", "rev", "plan", 1.0)
    assert tr.remaining("t3", "plan") == pytest.approx(tr.cost("plan") + 2.0 + 4.0)


def test_task_scope_nesting_and_validation():
    from agentrt import current_task

    assert current_task() is None
    with task_scope("job-1", workflow="rev") as outer:
        with task_scope() as inner:
            assert inner == outer
        with task_scope("job-2") as other:
            assert other.task_id == "job-2" and other.workflow is None
    with pytest.raises(ConfigError):
        with task_scope(""):
            pass


def test_cost_model_learns_a_decode_step_line_in_the_batch_size():
    """Decode-only steps of 1..8 sequences priced base + per_seq * n are fitted to that line
    (a CPU's rows each add work); steps of one size only give a flat line at their mean."""
    from agentrt.kv.tier import CostModel

    cm = CostModel(alpha=0.2)
    assert cm.decode_s(4) == 0.0  # nothing seen yet
    for _ in range(40):
        for n in (1, 2, 4, 8):
            cm.observe(0.005 + 0.001 * n, 0, n)
    assert cm.decode_per_seq_s == pytest.approx(0.001, rel=0.05)
    assert cm.decode_s(8) == pytest.approx(0.013, rel=0.05)
    flat = CostModel()
    for _ in range(5):
        flat.observe(0.02, 0, 4)
    assert flat.decode_per_seq_s == 0.0 and flat.decode_s(1) == flat.decode_s(16) == pytest.approx(0.02)


def test_topas_age_admission_serves_the_oldest_task_first_on_the_resident_prefix():
    """With admission="age", the requests on the resident prefix go oldest task first, even
    against a longer resident match (the default's order); room for two of three."""
    old = ready("a_old", "A", remaining=0.9, resident=PREFIX, task_arrival=0.0)
    warm = [ready(f"a_warm{i}", "A", remaining=0.9, resident=PREFIX + 50 * (i + 1), task_arrival=5.0 + i)
            for i in range(2)]
    v = view([*warm, old], resident={"A": PREFIX}, budget=PREFIX + 200, now=10.0)
    assert Topas(admission="age").decide(v).order[:2] == ["a_old", "a_warm0"]
    assert Topas().decide(v).order[:2] == ["a_warm1", "a_warm0"]
    with pytest.raises(ConfigError, match="admission"):
        Topas(admission="newest")


def test_topas_switch_leaves_the_running_stage_for_the_oldest_tasks_full_batch():
    """switch_full=1: A requests run; the oldest waiting task is at C. With a full batch ready at C
    (the budget less C's prefix, over the requests' cells: 5), only C's requests are ordered and
    only C is kept (A drains); with fewer, TOPAS decides as without the option."""
    running = [ready("a_run", "A", remaining=0.9, resident=PREFIX, task_arrival=8.0)]
    a_new = ready("a_new", "A", remaining=0.9, resident=PREFIX, task_arrival=9.0)
    cs = [ready(f"c{i}", "C", remaining=0.3, task_arrival=float(i)) for i in range(5)]
    v = view([a_new, *cs], resident={"A": PREFIX}, running=running, budget=PREFIX + 500, now=10.0)
    d = Topas(switch_full=1.0).decide(v)
    assert d.order == ["c0", "c1", "c2", "c3", "c4"] and d.keep == frozenset({"C"})
    v4 = view([a_new, *cs[:4]], resident={"A": PREFIX}, running=running, budget=PREFIX + 500, now=10.0)
    assert Topas(switch_full=1.0).decide(v4).order == Topas().decide(v4).order
    from agentrt import EngineConfig
    with pytest.raises(ConfigError, match="topas_switch_full"):
        EngineConfig(topas_switch_full=-1.0)
    with pytest.raises(ConfigError, match="topas_admission"):
        EngineConfig(topas_admission="newest")
