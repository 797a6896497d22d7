"""What the engine knows of tasks (agentrt/workflow.py): each task's arrival and current stage,
the workflows (declared, or learned from observed stage transitions), and each stage's service
time learned from the requests served. Scheduling policies (scheduling/policies.py) read it:
`remaining(task, stage)` is the expected service on the task's longest remaining path.
Bounded: at most `max_tasks` tasks are remembered (the least recently seen is forgotten)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrt.errors import ConfigError
from agentrt.prefixes import common_prefix
from agentrt.workflow import Workflow

EWMA = 0.3  # weight of a new observation in a stage's service estimate
RECENT_TASKS = 256  # upcoming() looks at this many most recently seen tasks
MAX_PREFIX = 16384  # tokens of a stage's static prefix remembered at most


@dataclass
class TaskState:
    task_id: str
    workflow: str | None
    arrival: float  # the core clock's now() at its first request
    stage: str | None = None  # the stage of its latest request
    requests: int = 0
    live: int = 0  # its requests queued or running now
    idle_since: float = 0.0  # when its last live request ended (it may be running a tool)


@dataclass
class LearnedDag:
    """Stage transitions seen in tasks without a declared workflow; an edge that would close a
    cycle (a stage revisited later in a task) is not added."""

    edges: dict[str, set[str]] = field(default_factory=dict)
    _wf: Workflow | None = None

    def add(self, src: str | None, dst: str) -> None:
        self.edges.setdefault(dst, set())
        if src is None or src == dst or dst in self.edges.get(src, ()) or self._reaches(dst, src):
            return
        self.edges.setdefault(src, set()).add(dst)
        self._wf = None

    def _reaches(self, a: str, b: str) -> bool:
        seen, todo = {a}, [a]
        while todo:
            for x in self.edges.get(todo.pop(), ()):
                if x == b:
                    return True
                if x not in seen:
                    seen.add(x)
                    todo.append(x)
        return False

    def workflow(self) -> Workflow:
        if self._wf is None:
            self._wf = Workflow("learned", {s: tuple(sorted(v)) for s, v in self.edges.items()})
        return self._wf


class TaskTracker:
    def __init__(self, max_tasks: int = 4096):
        self.max_tasks = max_tasks
        self.tasks: OrderedDict[str, TaskState] = OrderedDict()
        self.workflows: dict[str, Workflow] = {}
        self.learned = LearnedDag()
        self.stage_cost: dict[str, float] = {}  # stage -> expected service seconds per request
        # stage -> (its static prefix: the common prefix of its prompts so far, their cache salt)
        self.prefixes: dict[str, tuple[list[int], str | None]] = {}

    def declare(self, wf: Workflow) -> None:
        if not isinstance(wf, Workflow):
            raise ConfigError(f"declare_workflow takes an agentrt.Workflow, got {type(wf).__name__}")
        self.workflows[wf.name] = wf
        for s, c in wf.cost.items():
            self.stage_cost.setdefault(s, c)

    def observe(self, task_id: str | None, workflow: str | None, stage: str | None, now: float,
                prompt: Sequence[int] = (), salt: str | None = None) -> None:
        """A request of `task_id` at `stage` with `prompt` arrived."""
        if stage is not None and prompt:
            self._learn_prefix(stage, prompt, salt)
        if task_id is None:
            return
        t = self.tasks.get(task_id)
        if t is None:
            t = self.tasks[task_id] = TaskState(task_id, workflow, now)
            while len(self.tasks) > self.max_tasks:
                self.tasks.popitem(last=False)
        else:
            self.tasks.move_to_end(task_id)
        if stage is not None and (t.workflow is None or t.workflow not in self.workflows):
            self.learned.add(t.stage, stage)
        t.stage = stage if stage is not None else t.stage
        t.requests += 1
        t.live += 1

    def _learn_prefix(self, stage: str, prompt: Sequence[int], salt: str | None) -> None:
        old = self.prefixes.get(stage)
        if old is None or old[1] != salt:
            self.prefixes[stage] = (list(prompt[:MAX_PREFIX]), salt)
        elif old[0] and prompt[:len(old[0])] != old[0]:
            self.prefixes[stage] = (old[0][:common_prefix(old[0], list(prompt[:len(old[0])]))], salt)

    def prefix_of(self, stage: str | None) -> tuple[list[int], str | None]:
        """The stage's static prefix (tokens every request of it began with) and cache salt."""
        return ([], None) if stage is None else self.prefixes.get(stage, ([], None))

    def prefix_len(self, stage: str | None) -> int:
        return len(self.prefixes[stage][0]) if stage in self.prefixes else 0

    def ended(self, task_id: str | None, now: float) -> None:
        """A request of `task_id` ended (finished, failed or cancelled)."""
        t = self.tasks.get(task_id) if task_id is not None else None
        if t is not None and t.live > 0:
            t.live -= 1
            t.idle_since = now

    def upcoming(self, now: float, window_s: float) -> dict[str, float]:
        """Stages that tasks between requests (none live, the last ended within `window_s`:
        running a tool, or about to enter the next stage) are expected to ask for next: half
        their current stage (another call), half its successors."""
        out: dict[str, float] = {}
        for t in itertools.islice(reversed(self.tasks.values()), RECENT_TASKS):  # most recently seen first
            if t.live or t.stage is None or now - t.idle_since > window_s:
                continue
            succ = self.successors(t.task_id, t.stage)
            out[t.stage] = out.get(t.stage, 0.0) + (0.5 if succ else 1.0)
            for a in succ:
                out[a] = out.get(a, 0.0) + 0.5 / len(succ)
        return out

    def served(self, stage: str | None, seconds: float) -> None:
        """A request of `stage` took `seconds` from admission to its end."""
        if stage is None or seconds < 0:
            return
        old = self.stage_cost.get(stage)
        self.stage_cost[stage] = seconds if old is None else (1 - EWMA) * old + EWMA * seconds

    def workflow_of(self, task_id: str | None) -> Workflow | None:
        t = self.tasks.get(task_id) if task_id is not None else None
        if t is None:
            return None
        wf = self.workflows.get(t.workflow) if t.workflow is not None else None
        return wf if wf is not None else self.learned.workflow()

    def cost(self, stage: str | None) -> float:
        """Expected service seconds of one request of `stage` (the mean over stages if unseen)."""
        if stage in self.stage_cost:
            return self.stage_cost[stage]
        return sum(self.stage_cost.values()) / len(self.stage_cost) if self.stage_cost else 1.0

    def remaining(self, task_id: str | None, stage: str | None) -> float:
        """Expected service on the task's longest remaining path, `stage` included."""
        wf = self.workflow_of(task_id)
        if wf is None or stage is None or stage not in wf.edges:
            return self.cost(stage)
        return wf.longest_path(stage, self.stage_cost, self.cost(None))

    def successors(self, task_id: str | None, stage: str | None) -> tuple[str, ...]:
        wf = self.workflow_of(task_id)
        return wf.successors(stage) if wf is not None and stage is not None else ()

    def arrival(self, task_id: str | None, default: float) -> float:
        t = self.tasks.get(task_id) if task_id is not None else None
        return t.arrival if t is not None else default
