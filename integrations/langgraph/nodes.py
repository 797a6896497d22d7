"""LangGraph nodes and Functional-API tasks backed by agentrt agent actors.

`agent_node(agent, runtime)` is a node that hands the graph's new messages to an `Agent` actor
(one per thread, activated lazily in the `Runtime`), which runs its own model -> tool loop with
direct Python calls in its own KV session, and returns the messages the turn added. The
checkpoint stays the source of truth: the node remembers which graph messages each thread's
agent has read; when the history no longer starts with them (time travel, an edited state) the
agent is restarted with a fresh session and reads the whole history again.

Handoffs: `agent_node(..., handoffs=["math"])` gives the agent a `transfer_to_math(task)` tool
that ends its turn; the node then returns `Command(goto="math", update=...)`, and the target
agent reads the task as its new message.

Tasks (workflow.py): the agent's turn belongs to the enclosing `agentrt.task_scope`, else to the
graph run (one invoke = one task); its stage is the agent's name (its session's tag), so name
the node after the agent (`add_node(agent_node(...))` does) for a declared workflow to match.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Protocol, cast

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentrt.errors import ConfigError
from agentrt.runtime.agent import Agent
from agentrt.tools import Tool
from agentrt.workflow import task_scope

from .messages import content_text
from .tasks import GraphTasks

HANDOFF_PREFIX = "transfer_to_"


def handoff_tool(target: str, description: str | None = None) -> Tool:
    """A tool that ends the agent's turn and hands `task` to the agent node `target`."""
    def transfer(task: str) -> str:
        return f"Handed the task to {target}."

    return Tool.from_function(transfer, name=f"{HANDOFF_PREFIX}{target}",
                              description=description or f"Hand the task to the {target} agent. "
                                                          "task: what it should do, in one sentence.")


class AgentNode(Protocol):
    """What `agent_node` returns: a node function named after its agent, carrying its binding
    (workflow.py reads it: the node's stage is the agent's name)."""

    __name__: str
    binding: AgentBinding

    def __call__(self, state: dict[str, Any], config: Any) -> Awaitable[Any]: ...


class AgentTask(Protocol):
    """What `agent_task` returns: LangGraph's task of the agent's turn, carrying its binding."""

    binding: AgentBinding

    def __call__(self, messages: list[BaseMessage]) -> Any: ...  # (LangGraph's future of the messages)


class AgentBinding:
    """One agent definition bound to a Runtime: per-thread actors and what each has read."""

    def __init__(self, agent: Agent, runtime, handoffs: Sequence[str] | Mapping[str, str | None] = (),
                 output: str = "full_history"):
        if not isinstance(agent, Agent):
            raise ConfigError(f"agent_node takes an agentrt Agent, got {type(agent).__name__}")
        if output not in ("full_history", "last_message"):
            raise ConfigError(f"output must be 'full_history' or 'last_message', got {output!r}")
        handoffs = dict(handoffs) if isinstance(handoffs, Mapping) else {t: None for t in handoffs}
        spec = agent.spec  # the whole definition, plus the handoff tools, which end the turn
        self.template = Agent.from_spec(replace(
            spec, engine=agent.engine, tools=spec.tools + tuple(handoff_tool(t, d) for t, d in handoffs.items()),
            stop_at_tools=spec.stop_at_tools + tuple(f"{HANDOFF_PREFIX}{t}" for t in handoffs)))
        self.runtime, self.output = runtime, output
        self.name: str = agent.spec.name
        self._read: dict[str, list[str]] = {}  # thread -> ids of the graph messages read so far
        self.last_result: dict[str, Any] = {}  # thread -> the agent's last TurnResult (usage etc.)
        self.tasks = GraphTasks()

    async def run(self, messages: Sequence[BaseMessage], config) -> tuple[list[BaseMessage], str | None]:
        """One turn on the thread's agent, in the run's task: (messages to add, handoff target)."""
        task = self.tasks.context(config)
        with task_scope(task.task_id, task.workflow) if task is not None else nullcontext():
            return await self._turn(messages, _thread(config))

    async def _turn(self, messages: Sequence[BaseMessage], thread: str) -> tuple[list[BaseMessage], str | None]:
        ids = [m.id or f"#{i}" for i, m in enumerate(messages)]
        read = self._read.get(thread, [])
        ref = await self.runtime.actor(self.name, thread, lambda key: self.template.fresh())
        if ids[:len(read)] != read:  # the history changed under the agent: start it over
            await ref.stop()
            ref = await self.runtime.actor(self.name, thread, lambda key: self.template.fresh())
            read = []
        new = [d for m in messages[len(read):] if (d := self._as_input(m)) is not None]
        result = self.last_result[thread] = await ref.ask(new or [{"role": "user", "content": "Continue."}])
        out = to_langchain(result.messages, self.name)
        if self.output == "last_message":
            out = out[-1:]
        self._read[thread] = ids + [m.id for m in out if m.id is not None]  # (to_langchain gives each an id)
        target = result.stopped_by_tool
        return out, target[len(HANDOFF_PREFIX):] if target and target.startswith(HANDOFF_PREFIX) else None

    def _as_input(self, m: BaseMessage) -> dict | None:
        """A graph message as this agent reads it (None: not for it)."""
        if isinstance(m, HumanMessage):
            return {"role": "user", "content": content_text(m.content)}
        if isinstance(m, AIMessage) and m.name != self.name:
            for call in m.tool_calls:
                if call["name"] == f"{HANDOFF_PREFIX}{self.name}":
                    return {"role": "user", "content": f"{m.name or 'assistant'} asks: {call['args'].get('task', '')}"}
            text = content_text(m.content).strip()
            return {"role": "user", "content": f"{m.name or 'assistant'}: {text}"} if text else None
        return None  # its own messages are in its session; tool results belong to their caller


def to_langchain(messages: Sequence[dict], name: str) -> list[BaseMessage]:
    """An agent turn's messages (chat-format dicts) -> LangChain messages, with ids."""
    out: list[BaseMessage] = []
    for d in messages:
        if d["role"] == "tool":
            out.append(ToolMessage(d["content"], tool_call_id=d["tool_call_id"], name=d.get("name")))
            continue
        calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"]), "id": c["id"]}
                 for c in d.get("tool_calls", ())]
        out.append(AIMessage(d.get("content") or "", tool_calls=calls, name=name))
    for i, m in enumerate(out):
        m.id = m.id or _message_id(name, m, i)
    return out


def _message_id(name: str, m: BaseMessage, i: int) -> str:
    import uuid

    return f"agentrt-{name}-{uuid.uuid4().hex[:12]}-{i}"


def agent_node(agent: Agent, runtime, *, handoffs: Sequence[str] | Mapping[str, str | None] = (),
               output: str = "full_history") -> AgentNode:
    """A LangGraph node (for a state with a `messages` list) backed by `agent`'s actor per thread.
    `handoffs`: target node names (or name -> tool description) the agent may hand over to."""
    from langgraph.types import Command

    binding = AgentBinding(agent, runtime, handoffs, output)

    async def node(state: dict[str, Any], config) -> Any:
        msgs, target = await binding.run(state["messages"], config)
        update = {"messages": msgs}
        return Command(goto=target, update=update) if target else update

    named = cast(AgentNode, node)  # (a function object takes attributes; mypy types it by its signature)
    named.__name__, named.binding = binding.name, binding
    return named


def agent_task(agent: Agent, runtime, *, output: str = "full_history") -> AgentTask:
    """The same as a Functional-API task: `await task(messages)` -> the new messages."""
    from langgraph.config import get_config
    from langgraph.func import task

    binding = AgentBinding(agent, runtime, (), output)

    async def run_agent(messages: list[BaseMessage]) -> list[BaseMessage]:
        msgs, _ = await binding.run(messages, get_config())
        return msgs

    run_agent.__name__ = binding.name
    # (langgraph's task(name=) leaves its decorator's ParamSpec unsolved: its typing, not ours)
    wrapped = cast(AgentTask, task(name=binding.name)(run_agent))  # type: ignore[arg-type]
    wrapped.binding = binding
    return wrapped


def _thread(config) -> str:
    conf = (config or {}).get("configurable") or {}
    return str(conf.get("thread_id", "default"))
