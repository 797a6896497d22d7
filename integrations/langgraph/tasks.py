"""The task and stage of a model call made in a LangGraph node (agentrt/workflow.py), for
`agent_node` / `agent_task` / `ChatAgentrt`: one `invoke`/`ainvoke`/`stream` of a graph = one
task (its subgraphs included).

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
from agentrt.workflow import TaskContext, current_task

WORKFLOW_KEY = "agentrt_workflow"  # configurable key naming the run's workflow
# RunControls a GraphTasks keeps alive: while one is held no new run's can take its address, so
# an id never names two runs the engine still remembers (its TaskTracker keeps 4096 tasks)
RETAINED_RUNS = 4096


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
