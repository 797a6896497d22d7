"""Interfaces of the cache layer. Eviction policies plug in here: LRU (`LRUPolicy`), agent-aware
(`agent_aware.AgentAwarePolicy`, CacheScout) and later workflow-aware (TOPAS), without touching
the radix tree. A policy ranks both radix leaves (what to evict) and idle sessions (what to
detach under memory pressure, kv/memory.py). Policies by name: registry.py."""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

from agentrt.errors import ConfigError


@runtime_checkable
class EvictableNode(Protocol):
    """What a policy may read of a radix node (read-only: the tree writes its nodes)."""

    @property
    def last_access(self) -> int:
        """The tree clock at the last match/insert touching this node."""
        ...

    @property
    def tag(self) -> str | None:
        """Who inserted it (agent / session name), for agent-aware policies."""
        ...

    @property
    def num_pages(self) -> int: ...


@runtime_checkable
class IdleSession(Protocol):
    """What a policy may read of an idle engine session (read-only)."""

    @property
    def last_used(self) -> int:
        """The engine clock when its last request finished."""
        ...

    @property
    def tag(self) -> str | None:
        """The agent / session name."""
        ...


# what a policy ranks comes back in its own type (the caller's nodes or sessions, reordered)
N = TypeVar("N", bound=EvictableNode)
S = TypeVar("S", bound=IdleSession)


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

    def victim_order(self, leaves: list[N]) -> list[N]:
        """`leaves` reordered: the first is evicted first."""
        ...

    def order_sessions(self, sessions: list[S]) -> list[S]:
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

    def victim_order(self, leaves: list[N]) -> list[N]:
        return sorted(leaves, key=lambda n: n.last_access)

    def order_sessions(self, sessions: list[S]) -> list[S]:
        return sorted(sessions, key=lambda s: s.last_used)

    def distances(self) -> dict[str, int]:
        return {}

    def check_invariants(self) -> None:
        pass


class _UserPolicy(EvictionPolicyBase):
    """A user-supplied policy object that is not an EvictionPolicyBase: its own hooks, the
    defaults for those it leaves out. Such an object is duck-typed by design (any object with a
    victim_order), so its hooks are looked up here, once: the engine never probes it again."""

    HOOKS = ("on_request", "on_insert", "on_access", "victim_order", "order_sessions", "distances",
             "check_invariants")

    def __init__(self, policy: object):
        self.inner = policy
        self.name = str(getattr(policy, "name", type(policy).__name__))  # (the user's object: optional)
        own = {hook: fn for hook in self.HOOKS if (fn := getattr(policy, hook, None)) is not None}  # (ditto)
        if not callable(own.get("victim_order")):
            raise ConfigError(f"an eviction policy needs victim_order(leaves); {type(policy).__name__} has none "
                              "(subclass agentrt.kv.eviction.EvictionPolicyBase for the defaults)")
        for hook, fn in own.items():
            setattr(self, hook, fn)


def as_eviction_policy(policy: object) -> EvictionPolicy:
    """`policy` with every hook callable: itself when it subclasses EvictionPolicyBase, else
    wrapped. It must rank leaves (victim_order) at least."""
    if isinstance(policy, EvictionPolicyBase):
        return policy
    return _UserPolicy(policy)


class LRUPolicy(EvictionPolicyBase):
    """Least recently used first (what vLLM and SGLang do): the base's defaults."""

    name = "lru"
