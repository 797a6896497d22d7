"""An agent's definition is one frozen AgentSpec: Agent builds it, fresh()/fork() and LangGraph's
agent_node change it with dataclasses.replace, so none of them can drop a field (agent_node used to
copy the fields by hand and lost context_policy and call_limits)."""

from __future__ import annotations

import dataclasses
from typing import Literal

import anyio
import pytest
from langchain_core.messages import HumanMessage

from agentrt import Agent, AgentSpec, CallLimits, ContextPolicy, Runtime, SamplingParams, tool
from agentrt.errors import ConfigError
from agentrt.integrations.langgraph import agent_node
from agentrt.toolcall.formats import HERMES
from tests.test_pipelined_tools import ScriptedEngine


@tool
def lookup(key: Literal["alpha", "beta"]) -> str:
    """Look a key up.

    Args:
        key: the key
    """
    return f"{key}=1"


def _every_field_set() -> dict:
    return dict(settings=SamplingParams(max_tokens=7), max_tool_rounds=3, tool_choice="required",
                constrained=False, parallel_tool_calls=True, deps={"db": 1}, stop_at_tools=["lookup"],
                context_policy=ContextPolicy(mode="raise", tool_result_tokens=64),
                call_limits=CallLimits(stop_on_repeat=False, max_calls=1))


def test_fresh_and_from_spec_keep_every_field():
    agent = Agent("a", "be brief", [lookup], **_every_field_set())
    assert isinstance(agent.spec, AgentSpec) and agent.settings is agent.spec.settings
    for copy in (agent.fresh(), Agent.from_spec(agent.spec)):
        assert copy.spec == agent.spec and copy is not agent
    assert agent.fresh("b").spec == dataclasses.replace(agent.spec, name="b")


def test_replace_checks_the_changed_field():
    spec = Agent("a", "", [lookup]).spec
    with pytest.raises(ConfigError):
        dataclasses.replace(spec, max_tool_rounds=-1)
    with pytest.raises(ConfigError):
        dataclasses.replace(spec, stop_at_tools=["nope"])
    with pytest.raises(ConfigError):
        Agent.from_spec({"name": "a"})
    assert dataclasses.replace(spec, tools=[lookup]).tools == spec.tools  # functions or Tools, kept as Tools


def test_agent_node_keeps_context_policy_and_call_limits():
    """The node's per-thread agents run the whole definition: with CallLimits(max_calls=1) a reply
    that writes two calls runs one."""
    policy, limits = ContextPolicy(mode="raise", tool_result_tokens=64), CallLimits(stop_on_repeat=False, max_calls=1)
    calls = [("lookup", {"key": "alpha"}), ("lookup", {"key": "beta"})]
    engine = ScriptedEngine([HERMES.render_calls(calls), "Done."])
    agent = Agent("a", "Use tools.", [lookup], engine=engine, constrained=False, context_policy=policy,
                  call_limits=limits)

    async def main():
        async with Runtime(engine) as rt:
            node = agent_node(agent, rt, handoffs=["b"])
            out = await node({"messages": [HumanMessage("go", id="h1")]}, {"configurable": {"thread_id": "t1"}})
            return node.binding.template, rt.get("a/t1").behavior, out

    template, running, out = anyio.run(main)
    for a in (template, running):
        assert a.spec.context_policy is policy and a.spec.call_limits is limits
        assert list(a.tools) == ["lookup", "transfer_to_b"] and a.spec.stop_at_tools == ("transfer_to_b",)
    assert [len(m.tool_calls) for m in out["messages"] if m.type == "ai"] == [1, 0]
