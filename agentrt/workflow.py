"""Tasks and workflows as facts the engine can see (docs/design.md section 4).

A *task* is one job through a multi-agent workflow (one user question through planner -> coder
-> reviewer); every model request made for it carries the task's id and its *stage* (the agent
making the request: the request's tag). A *workflow* is the DAG of stages every task of its kind
follows: declared by the user (`Workflow.chain`, `Workflow.from_edges`), derived from a compiled
LangGraph graph (`agentrt.integrations.langgraph.workflow_of`), or learned online by the engine
from the stage transitions it observes (scheduling/tasks.py). Workflow-aware scheduling policies
(scheduling/policies.py, scheduling/topas.py) use it to know how much work a task has left.

The task travels in a context variable, so code that makes requests on a task's behalf needs no
extra argument: `with task_scope("job-17", workflow="review"):` around the code (an agent's
turn, a LangGraph invocation) is enough; `Runtime` and the LangGraph adapter set it themselves.
"""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from agentrt.checks import set_frozen
from agentrt.errors import ConfigError

_NAMES = "workflow and stage names are non-empty strings"


@dataclass(frozen=True)
class Workflow:
    """A DAG of stages: `edges[s]` are the stages that may follow s (a conditional edge lists
    every possible successor). `cost` optionally gives a stage's expected service seconds; the
    engine learns it from the requests it serves otherwise."""

    name: str
    edges: Mapping[str, tuple[str, ...]]
    cost: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"Workflow name: {_NAMES}, got {self.name!r}")
        edges: dict[str, tuple[str, ...]] = {}
        for s, succ in dict(self.edges).items():
            succ = tuple(succ)
            for x in (s, *succ):
                if not isinstance(x, str) or not x:
                    raise ConfigError(f"workflow {self.name!r}: {_NAMES}, got {x!r}")
            edges[s] = tuple(dict.fromkeys(succ))
            for x in succ:
                edges.setdefault(x, ())
        for s, c in dict(self.cost).items():
            if s not in edges or not isinstance(c, (int, float)) or not c >= 0:
                raise ConfigError(f"workflow {self.name!r}: cost must map its stages to seconds >= 0, "
                                  f"got {s!r}: {c!r}")
        set_frozen(self, "edges", edges)
        set_frozen(self, "cost", dict(self.cost))
        _check_acyclic(self.name, edges)

    @classmethod
    def chain(cls, name: str, *stages: str, cost: Mapping[str, float] | None = None) -> "Workflow":
        """stages[0] -> stages[1] -> ... (the seed's A -> B -> C)."""
        if not stages:
            raise ConfigError("Workflow.chain needs at least one stage")
        edges: dict[str, tuple[str, ...]] = {a: (b,) for a, b in zip(stages, stages[1:])}
        edges.setdefault(stages[-1], ())
        return cls(name, edges, cost or {})

    @classmethod
    def from_edges(cls, name: str, edges: Iterable[tuple[str, str]], stages: Iterable[str] = (),
                   cost: Mapping[str, float] | None = None) -> "Workflow":
        """From (src, dst) pairs; `stages` adds stages without edges."""
        out: dict[str, list[str]] = {s: [] for s in stages}
        for pair in edges:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ConfigError(f"workflow {name!r}: edges are (src, dst) pairs, got {pair!r}")
            out.setdefault(pair[0], []).append(pair[1])
        return cls(name, {s: tuple(v) for s, v in out.items()}, cost or {})

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(self.edges)

    @property
    def entries(self) -> tuple[str, ...]:
        """Stages no edge leads to (where a task starts)."""
        targets = {x for succ in self.edges.values() for x in succ}
        return tuple(s for s in self.edges if s not in targets)

    def successors(self, stage: str) -> tuple[str, ...]:
        return self.edges.get(stage, ())

    def longest_path(self, stage: str, cost: Mapping[str, float], default: float = 1.0) -> float:
        """Expected service on the longest path from `stage` (included) to an exit; stages
        without a cost count `default`."""
        memo: dict[str, float] = {}

        def walk(s: str) -> float:
            if s not in memo:
                memo[s] = cost.get(s, default) + max((walk(x) for x in self.edges.get(s, ())), default=0.0)
            return memo[s]

        return walk(stage) if stage in self.edges else cost.get(stage, default)


def _check_acyclic(name: str, edges: Mapping[str, tuple[str, ...]]) -> None:
    _, back = split_back_edges(edges, list(edges))
    if back:
        raise ConfigError(f"workflow {name!r} has a cycle through {back[0][1]!r}: a workflow is a DAG "
                          "(a loop inside one stage, e.g. an agent's tool loop, is one stage)")


def split_back_edges(succ: Mapping[str, Iterable[str]], roots: list[str]) -> tuple[list, list]:
    """(forward edges, back edges) of a depth-first search from each root in turn (a node
    reached earlier is not a new root): dropping the back edges leaves a DAG."""
    state: dict[str, int] = {}  # 1: on the DFS path, 2: done
    kept: list[tuple[str, str]] = []
    back: list[tuple[str, str]] = []
    for root in roots:
        if root in state:
            continue
        state[root], stack = 1, [(root, iter(succ.get(root, ())))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                back.append((node, nxt))
            else:
                kept.append((node, nxt))
                if nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ.get(nxt, ()))))
    return kept, back


@dataclass(frozen=True)
class TaskContext:
    """The task requests made in this context belong to, and its workflow's name (None: the
    engine learns the workflow from the stage transitions it sees)."""

    task_id: str
    workflow: str | None = None


_CURRENT: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar("agentrt_task", default=None)


def new_task_id() -> str:
    return f"task-{uuid.uuid4().hex[:12]}"


def current_task() -> TaskContext | None:
    """The task of the running code (None outside any task_scope)."""
    return _CURRENT.get()


@contextlib.contextmanager
def task_scope(task_id: str | None = None, workflow: str | None = None) -> Iterator[TaskContext]:
    """Requests made inside belong to task `task_id` (a fresh id when None) of `workflow`. Nested
    scopes without an id keep the enclosing task (an agent asked by another agent works for the
    same task)."""
    if task_id is not None and (not isinstance(task_id, str) or not task_id):
        raise ConfigError(f"task_id must be a non-empty string or None, got {task_id!r}")
    if workflow is not None and (not isinstance(workflow, str) or not workflow):
        raise ConfigError(f"workflow must be a workflow's name or None, got {workflow!r}")
    outer = _CURRENT.get()
    if task_id is None and outer is not None:
        ctx = TaskContext(outer.task_id, workflow or outer.workflow)
    else:
        ctx = TaskContext(task_id or new_task_id(), workflow)
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def task_of(task: str | None, workflow: str | None) -> tuple[str | None, str | None]:
    """An explicit task (and workflow) wins; else the caller's task_scope, if any."""
    if task is not None:
        return task, workflow
    ctx = _CURRENT.get()
    if ctx is None:
        return None, workflow
    return ctx.task_id, workflow or ctx.workflow
