"""LangGraph graphs as agentrt workflows (agentrt/workflow.py).

- `workflow_of(graph)`: the DAG of a compiled graph's nodes, for `Engine.declare_workflow`.
- `declare_graph(engine, graph)`: declares it and returns the graph configured so that its runs
  name it (`configurable["agentrt_workflow"]`; pass that key in a run's config to the same effect).

Each graph run is one task, each node's calls one stage of it (tasks.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrt.engine.like import EngineLike
from agentrt.errors import ConfigError
from agentrt.workflow import Workflow, split_back_edges

from .nodes import AgentBinding
from .tasks import WORKFLOW_KEY

_START, _END = "__start__", "__end__"


def workflow_of(graph: Any, name: str | None = None) -> Workflow:
    """The agentrt Workflow of a compiled LangGraph graph (`builder.compile()`), named `name`
    (default `graph.name`). Stages are the nodes (an `agent_node`'s stage is its agent's name,
    the tag of its requests); a conditional edge or a node's `Command` destinations give every
    possible successor; `__start__`/`__end__` are dropped. LangGraph graphs may loop (agent <->
    tools) but a Workflow is a DAG: the back edges found by a depth-first search from the entry
    (edges to a node on the search's current path: a loop's way back) are dropped. Only what
    `graph.get_graph()` draws is seen: a conditional edge without a path map or a `Literal`
    return hint, or a `Command` goto without `destinations=`, adds no edge."""
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    if not isinstance(graph, Pregel):  # (what builder.compile() and @entrypoint make)
        hint = "; pass builder.compile()" if isinstance(graph, StateGraph) else ""
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
    from langgraph.graph.state import CompiledStateGraph

    out: dict[str, str] = {}
    if not isinstance(graph, CompiledStateGraph):  # (an @entrypoint's graph has no builder)
        return out
    for node, spec in graph.builder.nodes.items():
        # (LangGraph's private RunnableCallable: an async or a sync function)
        fn = getattr(spec.runnable, "afunc", None) or getattr(spec.runnable, "func", None)
        # any node function, a user's included: agent_node's carry their binding (nodes.py::AgentNode)
        binding = getattr(fn, "binding", None)
        if isinstance(binding, AgentBinding):
            out[node] = binding.name
    return out


def declare_graph(engine: EngineLike, graph: Any, name: str | None = None) -> Any:
    """Declare `workflow_of(graph, name)` on `engine` and return the graph configured so its
    runs name that workflow (`graph.with_config(configurable={"agentrt_workflow": name})`): use
    the returned graph. The engine then schedules the graph's tasks on the declared DAG."""
    if not isinstance(engine, EngineLike):  # (an Engine, or a cluster's RemoteEngine)
        raise ConfigError(f"declare_graph takes an agentrt Engine first, got {type(engine).__name__}")
    wf = workflow_of(graph, name)
    engine.declare_workflow(wf)
    return graph.with_config(configurable={WORKFLOW_KEY: wf.name})
