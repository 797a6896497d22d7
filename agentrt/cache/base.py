"""Interfaces of the cache layer. Eviction policies plug in here: LRU today; agent-aware
(CacheScout) and workflow-aware (TOPAS) policies later, without touching the radix tree."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class EvictableNode(Protocol):
    """What a policy may read of a radix node."""

    last_access: int  # tree clock at the last match/insert touching this node
    tag: str | None  # who inserted it (agent / session name), for agent-aware policies
    num_pages: int


class EvictionPolicy(Protocol):
    """Ranks unlocked radix leaves for eviction. Called on the scheduler's hot path: keep it
    O(candidates log candidates) or better."""

    def on_insert(self, node: EvictableNode) -> None: ...

    def on_access(self, node: EvictableNode) -> None: ...

    def victim_order(self, leaves: list[EvictableNode]) -> list[EvictableNode]:
        """`leaves` reordered: the first is evicted first."""
        ...


class LRUPolicy:
    """Least recently used first (what vLLM and SGLang do)."""

    name = "lru"

    def on_insert(self, node: EvictableNode) -> None:
        pass

    def on_access(self, node: EvictableNode) -> None:
        pass

    def victim_order(self, leaves: list[EvictableNode]) -> list[EvictableNode]:
        return sorted(leaves, key=lambda n: n.last_access)
