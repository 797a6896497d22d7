"""Eviction policies by their EngineConfig name. The factory sits above every implementation
(base.py's LRUPolicy, agent_aware.py's AgentAwarePolicy) and nothing below imports it."""

from __future__ import annotations

from agentrt.errors import ConfigError
from agentrt.kv.agent_aware import AgentAwarePolicy
from agentrt.kv.eviction import EvictionPolicy, LRUPolicy
from agentrt.policy_names import EVICTION_POLICIES


def make_policy(name: str) -> EvictionPolicy:
    """A fresh policy by its EngineConfig.eviction_policy name (one of EVICTION_POLICIES)."""
    for cls in (LRUPolicy, AgentAwarePolicy):
        if cls.name == name:
            return cls()
    raise ConfigError(f"unknown eviction policy {name!r}; expected one of {EVICTION_POLICIES}")
