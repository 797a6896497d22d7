"""The two MetaGPT-shaped software-development workflows of seed 004 (TOPAS), as seeded per-task
plans that the LangGraph graphs (bench/metagpt_graphs.py) and the simulator workload
(bench/metagpt_run.py) both follow.

- `metagpt_sop`: product manager -> architect -> project manager -> engineer <-> QA. The
  engineer-QA round repeats 1-3 times per task (drawn from the task's seed, not known to the
  engine): QA's tool answers "fix" until the last round, then "pass". Declared to the engine as
  the chain pm -> architect -> project_manager -> engineer -> qa (a Workflow is a DAG; a further
  round is a repeat of the engineer and QA stages).
- `metagpt_tl`: a team leader plans, its tool names 2-4 of {product manager, architect, engineer,
  QA} (drawn per task) that run concurrently (LangGraph `Send`), then the leader gathers (stage
  `gather`: the leader's own instructions and tool, so the same static prefix).

Every stage is an agent with a long role prompt (`prefix_tokens`) and one tool that sleeps for a
heavy-tailed, seeded latency (lognormal, scaled per tool: bench/workloads/latency.py). A stage
visit is two model calls: the tool call, then (after the tool) a short answer.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from agentrt import Workflow
from bench.workflow_workload import _seed
from bench.workloads.agentic import text_of_tokens
from bench.workloads.latency import LatencyDist, tool_scale

# stage -> (its role, its tool's name, what the tool does)
ROLES = {
    "product_manager": ("product manager", "write_prd", "Write the product requirements document for the request."),
    "architect": ("architect", "design_system", "Write the system design: modules, interfaces, data structures."),
    "project_manager": ("project manager", "plan_tasks", "Split the design into an ordered list of coding tasks."),
    "engineer": ("engineer", "write_code", "Write or fix the code for the current tasks and report what changed."),
    "qa": ("QA engineer", "run_tests", "Run the test suite on the current code; says pass or fix with the failures."),
    "leader": ("team leader", "coordinate", "Plan the work and assign it to the team, or merge the team's results."),
}
SOP_STAGES = ("product_manager", "architect", "project_manager", "engineer", "qa")
TEAM = ("product_manager", "architect", "engineer", "qa")
WORKFLOWS = {
    "metagpt_sop": Workflow.chain("metagpt_sop", *SOP_STAGES),
    "metagpt_tl": Workflow.from_edges("metagpt_tl", [("leader", r) for r in TEAM] + [(r, "gather") for r in TEAM]),
}
TOOL_DIST = "lognormal:0.3:1.0"  # median 0.3 s x the tool's scale (0.5-2x); p99 ~3 s


def role_of(stage: str) -> str:
    """The role whose prompt and tool a stage runs (the gather stage is the leader again)."""
    return "leader" if stage == "gather" else stage


@dataclass(frozen=True)
class MetaSizes:
    prefix_tokens: int = 2000  # each role's instructions (the tool schema and template add ~100)
    user_tokens: tuple[int, int] = (50, 121)  # the request / the message a stage reads (simulated prompts)
    result_tokens: tuple[int, int] = (30, 61)  # what a tool returns
    out_tokens: int = 40  # a call's output (the agents' max_tokens; the simulated calls' exact length)
    tool_dist: str = TOOL_DIST
    sop_rounds: tuple[int, int] = (1, 3)  # engineer-QA rounds per task, uniform
    tl_width: tuple[int, int] = (2, 4)  # roles the leader dispatches per task, uniform


@dataclass(frozen=True)
class Visit:
    """One run of a stage: its tool's latency, what its tool says (QA's verdict, the leader's
    assignment) and the sizes of its incoming message and tool result."""

    stage: str
    tool_s: float
    says: str
    user_tokens: int
    result_tokens: int


@dataclass(frozen=True)
class MetaPlan:
    task_id: str
    workflow: str
    index: int
    arrival: float  # seconds after the run's start
    groups: tuple[tuple[Visit, ...], ...]  # in order; the visits of one group run concurrently

    @property
    def visits(self) -> list[Visit]:
        return [v for g in self.groups for v in g]

    def visits_of(self, stage: str) -> list[Visit]:
        return [v for v in self.visits if v.stage == stage]

    @property
    def shape(self) -> list[list[str]]:
        """The stages per group (what a graph run should show)."""
        return [[v.stage for v in g] for g in self.groups]


def plan_task(workflow: str, sizes: MetaSizes, seed: int, i: int, arrival: float = 0.0) -> MetaPlan:
    """Task i of the seeded set `seed`: its rounds (SOP) or team (TL), and per visit its tool's
    latency and sizes. A function of (workflow, sizes, seed, i) alone."""
    rng = random.Random(_seed("metagpt", workflow, seed, i))
    dist = LatencyDist.parse(sizes.tool_dist)

    def visit(stage: str, says: str = "done") -> Visit:
        return Visit(stage, dist.draw(rng, tool_scale(ROLES[role_of(stage)][1])), says,
                     rng.randrange(*sizes.user_tokens), rng.randrange(*sizes.result_tokens))

    if workflow == "metagpt_sop":
        rounds = rng.randint(*sizes.sop_rounds)
        groups = [(visit(s),) for s in SOP_STAGES[:3]]
        for r in range(rounds):
            groups += [(visit("engineer"),), (visit("qa", "pass" if r == rounds - 1 else "fix"),)]
    elif workflow == "metagpt_tl":
        team = sorted(rng.sample(TEAM, rng.randint(*sizes.tl_width)), key=TEAM.index)
        groups = [(visit("leader", "assign: " + ", ".join(team)),), tuple(visit(r) for r in team),
                  (visit("gather", "merged"),)]
    else:
        raise ValueError(f"unknown workflow {workflow!r}; choose from {tuple(WORKFLOWS)}")
    return MetaPlan(f"{workflow}-{seed}-{i}", workflow, i, arrival, tuple(groups))


def make_plans(workflow: str, sizes: MetaSizes, n: int, rate: float, seed: int) -> list[MetaPlan]:
    """n tasks with Poisson arrivals at `rate` tasks/s (the first at 0): one seeded unit-rate
    pattern scaled by 1 / rate, so two loads differ only in how close the same tasks arrive."""
    rng = random.Random(_seed("metagpt-arrivals", workflow, seed))
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += rng.expovariate(1.0) / rate
        out.append(plan_task(workflow, sizes, seed, i, t))
    return out


def instructions(tok, stage: str, n_tokens: int) -> str:
    """A role's long static prompt (the gather stage's is the leader's, token for token)."""
    role = role_of(stage)
    name, tool, _ = ROLES[role]
    head = (f"You are the {name} of a software company that works as a team (product manager, architect, "
            f"project manager, engineer, QA, team leader). Always call your tool {tool} first, with a short "
            "query, then answer in one short sentence for the next role. Your standard operating procedure: ")
    return head + text_of_tokens(tok, n_tokens, random.Random(_seed("metagpt-role", role)))


def tool_schema(stage: str) -> dict:
    _, tool, what = ROLES[role_of(stage)]
    return {"type": "function", "function": {"name": tool, "description": what, "parameters": {
        "type": "object", "properties": {"query": {"type": "string", "maxLength": 24,
                                                        "description": "what to work on, a few words"}},
        "required": ["query"]}}}


def tool_result(tok, plan: MetaPlan, v: Visit, k: int) -> str:
    """What visit v's tool returns (its verdict or assignment first): seeded by task and visit."""
    rng = random.Random(_seed("metagpt-result", plan.task_id, v.stage, k))
    return f"{v.says}. " + text_of_tokens(tok, v.result_tokens, rng)


@dataclass
class SimCall:
    """A simulated model call: `prompt` (the whole prompt, a replay) or `suffix` (ids after the
    agent's previous prompt and output); `max_tokens` its exact output length; the tool after it."""

    suffix: list[int] = field(default_factory=list)
    tool_s: float = 0.0
    prompt: list[int] | None = None
    max_tokens: int = 16


def stage_prefixes(fmt, tok, workflow: str, sizes: MetaSizes) -> dict[str, list[int]]:
    """Stage -> its agent's static prefix ids (system prompt + its tool), as the simulator sends it."""
    stages = WORKFLOWS[workflow].stages
    return {s: fmt.encode([{"role": "system", "content": instructions(tok, s, sizes.prefix_tokens)}],
                          tools=[tool_schema(s)], add_generation_prompt=False) for s in stages}


def sim_calls(fmt, tok, plan: MetaPlan, sizes: MetaSizes) -> list[list[list[SimCall]]]:
    """Per group, per visit, its two calls (as plan.groups): the tool call after the message it
    reads, then the answer after the tool's result."""
    sys_msg = [{"role": "system", "content": "x"}]  # (deltas do not depend on the system text)
    out = []
    for g in plan.groups:
        row = []
        for v in g:
            k = plan.visits_of(v.stage).index(v)
            rng = random.Random(_seed("metagpt-msg", plan.task_id, v.stage, k))
            user = {"role": "user", "content": text_of_tokens(tok, v.user_tokens, rng)}
            prev = sys_msg + [user, {"role": "assistant", "content": "ok"}]
            tool = {"role": "tool", "content": json.dumps({"result": tool_result(tok, plan, v, k)}),
                    "tool_call_id": f"call_{k}"}
            row.append([SimCall(fmt.encode_delta(sys_msg, [user]), v.tool_s, max_tokens=sizes.out_tokens),
                        SimCall(fmt.encode_delta(prev, [tool]), 0.0, max_tokens=sizes.out_tokens)])
        out.append(row)
    return out


MAX_VISITS = {"metagpt_sop": 3 + 2 * MetaSizes.sop_rounds[1], "metagpt_tl": 2 + MetaSizes.tl_width[1]}


def pool_tokens(workflow: str, sizes: MetaSizes, prefix_len: float, room: float, work_share: float) -> int:
    """The seed's tight pool: `room` static prefixes (`prefix_len` tokens each, template and tool
    included) and `work_share` of one task's working set at its largest (every visit's message,
    tool result and two outputs), in whole pages of 16."""
    work = MAX_VISITS[workflow] * (sizes.user_tokens[1] + sizes.result_tokens[1] + 2 * sizes.out_tokens)
    return (int(room * prefix_len + work_share * work) + 15) // 16 * 16
