"""Interfaces of the cache layer. Eviction policies plug in here: LRU (`LRUPolicy`), agent-aware
(`agent_aware.AgentAwarePolicy`, CacheScout) and later workflow-aware (TOPAS), without touching
the radix tree. A policy ranks both radix leaves (what to evict) and idle sessions (what to
detach under memory pressure, kv/memory.py). Policies by name: registry.py."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrt.errors import ConfigError


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
    scheduler's hot path: keep it O(candidates log candidates) or better. Every hook is always
    called: a policy subclasses `EvictionPolicyBase` (each hook has a default), and a
    user-supplied object is wrapped by `as_eviction_policy` once, at the engine's start."""

    name: str

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

    def distances(self) -> dict[str, int]:
        """Agent tag -> how many agents away it is predicted to run (the tier's prefetch,
        kv/hierarchy.py); empty: no prediction."""
        ...

    def check_invariants(self) -> None: ...


class EvictionPolicyBase:
    """Every hook of `EvictionPolicy` with its default: no bookkeeping, least recently used
    first, no prediction, nothing to check. Policies override what they decide."""

    name = "base"

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

    def distances(self) -> dict[str, int]:
        return {}

    def check_invariants(self) -> None:
        pass


class _UserPolicy(EvictionPolicyBase):
    """A user-supplied policy object that is not an EvictionPolicyBase: its own hooks, the
    defaults for those it leaves out (looked up once, here)."""

    def __init__(self, policy):
        self.inner = policy
        self.name = str(getattr(policy, "name", type(policy).__name__))
        for hook in ("on_request", "on_insert", "on_access", "victim_order", "order_sessions", "distances",
                     "check_invariants"):
            own = getattr(policy, hook, None)
            if own is not None:
                setattr(self, hook, own)


def as_eviction_policy(policy) -> EvictionPolicy:
    """`policy` with every hook callable: itself when it subclasses EvictionPolicyBase, else
    wrapped. It must rank leaves (victim_order) at least."""
    if isinstance(policy, EvictionPolicyBase):
        return policy
    if not callable(getattr(policy, "victim_order", None)):
        raise ConfigError(f"an eviction policy needs victim_order(leaves); {type(policy).__name__} has none "
                          "(subclass agentrt.kv.eviction.EvictionPolicyBase for the defaults)")
    return _UserPolicy(policy)


class LRUPolicy(EvictionPolicyBase):
    """Least recently used first (what vLLM and SGLang do): the base's defaults."""

    name = "lru"
