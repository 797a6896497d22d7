"""Placement policies: which replica an agent lives on.

A policy sees the agent (`AgentInfo`: its name and a key of its static prefix -- instructions
and tools) and every replica (`ReplicaView`: alive, KV occupancy, queue depth, agents placed,
the prefix keys of those agents) and returns a replica index. In `ClusterRuntime` an agent is
placed once, at spawn, and stays there for its life; it moves only by migration (an overloaded
or drained replica) or failover (a dead one), each placed again by the same policy.

  * `round_robin`: in turn.
  * `least_loaded`: the lowest KV occupancy, then the shortest queue, then the fewest agents.
  * `prefix_affine`: the replica already holding agents with the same prefix (their shared
    instructions and tools are prefilled once there), unless its load exceeds the least loaded
    one's by the balance thresholds -- the rule of sglang-router's and vllm-router's
    `cache_aware` policy (absolute 32 requests, relative 1.5x here, in agents).
  * `session_affine` (default): least loaded at spawn; with migration (`ClusterRuntime.rebalance`)
    it is what keeps each agent's whole session resident on one replica.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agentrt.errors import ConfigError, ReplicaLost


@dataclass(frozen=True)
class AgentInfo:
    name: str
    prefix_key: str = ""


@dataclass
class ReplicaView:
    index: int
    alive: bool = True
    kv_occupancy: float = 0.0
    queue: int = 0  # requests waiting + running
    agents: int = 0
    prefixes: dict[str, int] = field(default_factory=dict)  # prefix key -> agents with it here


def prefix_key(instructions: str, tools: Sequence[dict] | None) -> str:
    """A key of an agent's static prefix: equal for agents that share instructions and tools."""
    text = json.dumps([instructions, tools or []], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


Policy = Callable[[AgentInfo, Sequence[ReplicaView]], int]


def _alive(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    alive = [r for r in replicas if r.alive]
    if not alive:
        raise ReplicaLost("no replica is alive to place an agent on: start the cluster again")
    return alive


def least_loaded(agent: AgentInfo, replicas: Sequence[ReplicaView]) -> int:
    return min(_alive(replicas), key=lambda r: (round(r.kv_occupancy, 2), r.queue, r.agents, r.index)).index


def session_affine(agent: AgentInfo, replicas: Sequence[ReplicaView]) -> int:
    return least_loaded(agent, replicas)


@dataclass
class RoundRobin:
    _turn: itertools.count = field(default_factory=itertools.count)

    def __call__(self, agent: AgentInfo, replicas: Sequence[ReplicaView]) -> int:
        alive = _alive(replicas)
        return alive[next(self._turn) % len(alive)].index


@dataclass(frozen=True)
class PrefixAffine:
    balance_abs: int = 32
    balance_rel: float = 1.5

    def __call__(self, agent: AgentInfo, replicas: Sequence[ReplicaView]) -> int:
        alive = _alive(replicas)
        lightest = min(alive, key=lambda r: (r.agents, r.index))
        holders = [r for r in alive if r.prefixes.get(agent.prefix_key)]
        if not holders:
            return least_loaded(agent, alive)
        best = max(holders, key=lambda r: (r.prefixes[agent.prefix_key], -r.agents, -r.index))
        imbalanced = best.agents - lightest.agents > self.balance_abs and best.agents > self.balance_rel * lightest.agents
        return lightest.index if imbalanced else best.index


def make_policy(name_or_policy: str | Policy) -> Policy:
    """A policy by name ("round_robin", "least_loaded", "prefix_affine", "session_affine") or a callable."""
    if callable(name_or_policy):
        return name_or_policy
    table: dict[str, Callable[[], Policy]] = {
        "round_robin": RoundRobin, "least_loaded": lambda: least_loaded, "prefix_affine": PrefixAffine,
        "session_affine": lambda: session_affine}
    if name_or_policy not in table:
        raise ConfigError(f"placement must be one of {sorted(table)} or a callable (agent, replicas) -> index, "
                          f"got {name_or_policy!r}")
    return table[name_or_policy]()
