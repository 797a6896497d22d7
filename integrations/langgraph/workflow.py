"""LangGraph graphs as agentrt tasks and workflows (agentrt/workflow.py).

- `workflow_of(graph)`: the DAG of a compiled graph's nodes, for `Engine.declare_workflow`.
- `declare_graph(engine, graph)`: declares it and returns the graph configured so that its runs
  name it (`configurable["agentrt_workflow"]`; pass that key in a run's config to the same effect).
- `GraphTasks`: the task of the graph run a node runs in, for `agent_node` / `agent_task` /
  `ChatAgentrt`: one `invoke`/`ainvoke`/`stream` of the graph = one task (its subgraphs included).

The task of a model call made in a node, in order: the enclosing `agentrt.task_scope` (explicit
wins); else the graph run's. LangGraph's config gives no id that lives exactly one run (thread_id
spans runs, checkpoint ids and run ids of the callbacks change per step or node, `run_id` only
reaches the top-level nodes when the caller passes one), so the run is recognised by its
`RunControl` (`config["configurable"]["__pregel_runtime"].control`, LangGraph >= 1.0: one object
per top-level run, shared with its subgraphs). Without it (older LangGraph) a call outside any
task_scope has no task. The stage of a call is the request's tag: an `agent_node`'s agent name,
else the node's name (`config["metadata"]["langgraph_node"]`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from agentrt.errors import ConfigError
from agentrt.workflow import TaskContext, Workflow, current_task, split_back_edges

WORKFLOW_KEY = "agentrt_workflow"  # configurable key naming the run's workflow
_START, _END = "__start__", "__end__"
# RunControls a GraphTasks keeps alive: while one is held no new run's can take its address, so
# an id never names two runs the engine still remembers (its TaskTracker keeps 4096 tasks)
RETAINED_RUNS = 4096


def workflow_of(graph: Any, name: str | None = None) -> Workflow:
    """The agentrt Workflow of a compiled LangGraph graph (`builder.compile()`), named `name`
    (default `graph.name`). Stages are the nodes (an `agent_node`'s stage is its agent's name,
    the tag of its requests); a conditional edge or a node's `Command` destinations give every
    possible successor; `__start__`/`__end__` are dropped. LangGraph graphs may loop (agent <->
    tools) but a Workflow is a DAG: the back edges found by a depth-first search from the entry
    (edges to a node on the search's current path: a loop's way back) are dropped. Only what
    `graph.get_graph()` draws is seen: a conditional edge without a path map or a `Literal`
    return hint, or a `Command` goto without `destinations=`, adds no edge."""
    # third-party LangGraph objects, of versions we do not pin: a compiled graph draws itself;
    if isinstance(graph, type) or not callable(getattr(graph, "get_graph", None)):
        # (a builder compiles: the hint)
        hint = "; pass builder.compile()" if callable(getattr(graph, "compile", None)) else ""
        raise ConfigError(f"workflow_of takes a compiled LangGraph graph, got {type(graph).__name__}{hint}")
    name = graph.name if name is None else name
    if not isinstance(name, str) or not name:
        raise ConfigError(f"workflow_of: name must be a non-empty str (or None: the graph's name), got {name!r}")
    drawn = graph.get_graph()
    stage = _stage_names(graph)
    edges: dict[str, list[str]] = {stage.get(n, n): [] for n in drawn.nodes if n not in (_START, _END)}
    succ: dict[str, list[str]] = {}
    for e in drawn.edges:
        succ.setdefault(e.source, []).append(e.target)
    for src, dst in _forward_edges(succ, list(drawn.nodes)):
        if src not in (_START, _END) and dst not in (_START, _END):
            edges.setdefault(stage.get(src, src), []).append(stage.get(dst, dst))
    return Workflow(name, {s: tuple(v) for s, v in edges.items()})


def _forward_edges(succ: Mapping[str, list[str]], nodes: list[str]) -> list[tuple[str, str]]:
    """The edges left when a DFS from __start__ (then from any node not reached) drops back edges."""
    return split_back_edges(succ, [n for n in [_START, *nodes] if n in nodes])[0]


def _stage_names(graph: Any) -> dict[str, str]:
    """node -> stage where they differ: an agent_node's requests carry its agent's name."""
    out: dict[str, str] = {}
    # LangGraph internals (third-party, unpinned): builder.nodes -> specs -> runnables -> functions
    for node, spec in (getattr(getattr(graph, "builder", None), "nodes", None) or {}).items():
        runnable = getattr(spec, "runnable", None)  # (LangGraph's StateNodeSpec)
        # (LangGraph's RunnableCallable: an async or a sync function)
        fn = getattr(runnable, "afunc", None) or getattr(runnable, "func", None)
        # any node function: only agent_node's carry a binding (nodes.py), whose name is the stage
        binding = getattr(fn, "binding", None)
        if isinstance(getattr(binding, "name", None), str):  # (a user's function may hold another `binding`)
            out[node] = binding.name
    return out


def declare_graph(engine: Any, graph: Any, name: str | None = None) -> Any:
    """Declare `workflow_of(graph, name)` on `engine` and return the graph configured so its
    runs name that workflow (`graph.with_config(configurable={"agentrt_workflow": name})`): use
    the returned graph. The engine then schedules the graph's tasks on the declared DAG."""
    # a public input: an Engine, or a stand-in that declares workflows (a cluster's)
    if not callable(getattr(engine, "declare_workflow", None)):
        raise ConfigError(f"declare_graph takes an agentrt Engine first, got {type(engine).__name__}")
    wf = workflow_of(graph, name)
    engine.declare_workflow(wf)
    return graph.with_config(configurable={WORKFLOW_KEY: wf.name})


def configured_workflow(config: Mapping[str, Any] | None) -> str | None:
    """The workflow a run's config names (`configurable["agentrt_workflow"]`), validated."""
    wf = ((config or {}).get("configurable") or {}).get(WORKFLOW_KEY)
    if wf is not None and (not isinstance(wf, str) or not wf):
        raise ConfigError(f"configurable[{WORKFLOW_KEY!r}] must be a workflow's name (a non-empty str), got {wf!r}")
    return wf


def node_name(config: Mapping[str, Any] | None) -> str | None:
    """The LangGraph node a call runs in (None outside a graph)."""
    node = ((config or {}).get("metadata") or {}).get("langgraph_node")
    return node if isinstance(node, str) and node else None


class GraphTasks:
    """The task of the graph run a node runs in (see the module docstring)."""

    def __init__(self) -> None:
        self._runs: OrderedDict[int, Any] = OrderedDict()  # id(RunControl) -> it, held
        self._lock = threading.Lock()  # (sync graphs call from worker threads)

    def context(self, config: Mapping[str, Any] | None) -> TaskContext | None:
        """The task a call with run config `config` belongs to (None: no task)."""
        workflow = configured_workflow(config)
        outer = current_task()
        if outer is not None:
            return TaskContext(outer.task_id, outer.workflow or workflow)
        runtime = ((config or {}).get("configurable") or {}).get("__pregel_runtime")
        # LangGraph's private run object (third-party, unpinned): its control names the run
        control = getattr(runtime, "control", None)
        if control is None:
            return None
        with self._lock:
            self._runs[id(control)] = control
            self._runs.move_to_end(id(control))
            while len(self._runs) > RETAINED_RUNS:
                self._runs.popitem(last=False)
        return TaskContext(f"lg-{id(control):x}", workflow)
