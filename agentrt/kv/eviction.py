"""Interfaces of the cache layer. Eviction policies plug in here: LRU (`LRUPolicy`), agent-aware
(`agent_aware.AgentAwarePolicy`, CacheScout) and later workflow-aware (TOPAS), without touching
the radix tree. A policy ranks both radix leaves (what to evict) and idle sessions (what to
detach under memory pressure, kv/memory.py). Policies by name: registry.py."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class EvictableNode(Protocol):
    """What a policy may read of a radix node."""

    last_access: int  # tree clock at the last match/insert touching this node
    tag: str | None  # who inserted it (agent / session name), for agent-aware policies
    num_pages: int


@runtime_checkable
class IdleSession(Protocol):
    """What a policy may read of an idle engine session."""

    last_used: int  # engine clock when its last request finished
    tag: str | None  # the agent / session name


class EvictionPolicy(Protocol):
    """Ranks unlocked radix leaves for eviction and idle sessions for detaching. Called on the
    scheduler's hot path: keep it O(candidates log candidates) or better. Optional hooks, looked
    up on the policy: `on_request` and `order_sessions` (left out: nothing, and least recently
    used first), `distances()` (the tier's prefetch, kv/hierarchy.py) and `check_invariants()`."""

    def on_request(self, tag: str | None) -> None:
        """A request of agent `tag` (None: unknown) was admitted."""
        ...

    def on_insert(self, node: EvictableNode) -> None: ...

    def on_access(self, node: EvictableNode) -> None: ...

    def victim_order(self, leaves: list[EvictableNode]) -> list[EvictableNode]:
        """`leaves` reordered: the first is evicted first."""
        ...

    def order_sessions(self, sessions: list[IdleSession]) -> list[IdleSession]:
        """`sessions` reordered: the first is detached first."""
        ...


class LRUPolicy:
    """Least recently used first (what vLLM and SGLang do)."""

    name = "lru"

    def on_request(self, tag: str | None) -> None:
        pass

    def on_insert(self, node: EvictableNode) -> None:
        pass

    def on_access(self, node: EvictableNode) -> None:
        pass

    def victim_order(self, leaves: list[EvictableNode]) -> list[EvictableNode]:
        return sorted(leaves, key=lambda n: n.last_access)

    def order_sessions(self, sessions: list[IdleSession]) -> list[IdleSession]:
        return sorted(sessions, key=lambda s: s.last_used)

