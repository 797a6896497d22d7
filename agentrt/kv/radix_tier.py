"""The radix tree's moves between the KV pool and the second tier (kv/tier.py): a resident
leaf leaves the pool (`discard`: demoted, or dropped with its demoted subtree), the tier makes
room (`make_room`: kept copies first, then demoted leaves in policy order), a match's demoted
continuation is found (`host_path`) and copied back (`promote`). The base of `RadixCache`
(kv/radix.py): what it uses of the tree is declared below, set or defined by the tree."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from agentrt.kv.eviction import EvictionPolicy
from agentrt.kv.identity import RootKey
from agentrt.kv.pages import PageAllocator
from agentrt.kv.radix_node import Node
from agentrt.kv.tier import HostTier
from agentrt.prefixes import common_prefix


class TierMoves(ABC):
    # the tree's collaborators and counters (RadixCache.__init__ sets them)
    alloc: PageAllocator
    ps: int  # tokens per page
    policy: EvictionPolicy
    tier: HostTier | None  # None: no second tier (a leaf that leaves the pool is dropped)
    demoted_pages: int  # pages moved out to the tier
    dropped_pages: int  # pages lost (not kept anywhere)

    @abstractmethod
    def _root(self, salt: RootKey) -> Node:
        """The root of the tree of KV keyed `salt`."""

    @abstractmethod
    def _tick(self, node: Node) -> None:
        """Refresh the access time of `node` and its ancestors."""

    @abstractmethod
    def _nodes(self) -> Iterator[Node]:
        """Every node of every root, roots included."""

    def _size(self, node: Node) -> int:
        """The node's length in pages, resident or not."""
        return len(node.key) // self.ps

    def discard(self, leaf: Node) -> int:
        """Take a resident leaf out of the pool: demoted to the tier when it has room, else
        dropped with its (demoted) subtree. Returns pages freed."""
        before = self.alloc.num_free
        n = len(leaf.pages)
        if self.tier is not None and self._demote(leaf, self.tier):
            self.demoted_pages += n
        else:
            self.dropped_pages += n
            self._drop(leaf)
        return self.alloc.num_free - before

    def _demote(self, leaf: Node, tier: HostTier) -> bool:
        if leaf.host is None:  # (a promoted node kept its copy: nothing to write)
            if not self.make_room(tier, len(leaf.pages), keep=leaf):
                return False
            leaf.host = tier.save(leaf.pages)
        self.alloc.decref(leaf.pages)
        leaf.pages, leaf.prefetched = [], False
        return True

    def make_room(self, tier: HostTier, n_pages: int, keep: Node | None = None) -> bool:
        """Free room in `tier` (the tree's) for n_pages: first the kept copies of resident nodes
        (oldest first), then demoted leaves (policy order); never a locked node or `keep`."""
        if n_pages > tier.capacity_pages:
            return False
        if tier.free_pages() >= n_pages:
            return True
        copies = sorted((x for x in self._nodes() if x.resident and x.host is not None and x is not keep),
                        key=lambda x: x.last_access)
        leaves = [x for x in self._nodes() if not x.resident and x.parent is not None and not x.children
                  and x.lock_ref == 0 and x is not keep]
        for x in copies:
            if x.host is not None:  # (always: chosen for it, and releasing one clears no other)
                tier.release(x.host)
            x.host = None
            if tier.free_pages() >= n_pages:
                return True
        for x in self.policy.victim_order(leaves):
            self.dropped_pages += self._size(x)
            self._drop(x)
            if tier.free_pages() >= n_pages:
                return True
        return False

    def _drop(self, node: Node) -> None:
        """Remove node (not a root) and its subtree from the tree, the pool and the tier."""
        assert node.parent is not None, "a radix root is never dropped (only leaves leave)"
        del node.parent.children[tuple(node.key[:self.ps])]
        stack = [node]
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            self.alloc.decref(x.pages)
            if x.host is not None and self.tier is not None:  # (a node has a copy only with a tier)
                self.tier.release(x.host)
            x.pages, x.host = [], None

    def host_path(self, tokens: list[int], salt: RootKey = None) -> list[Node]:
        """The demoted nodes that continue the resident match of `tokens`, top-down (each
        matches at least its first page; the last may match only part of its key)."""
        node, pos = self._root(salt), 0
        path: list[Node] = []
        while True:
            child = node.children.get(tuple(tokens[pos:pos + self.ps]))
            if child is None:
                return path
            m = self._common(tokens, pos, child.key)
            if child.resident and path:
                return path  # (cannot happen: a demoted node has no resident child)
            if not child.resident:
                path.append(child)
            if m < len(child.key):
                return path
            node, pos = child, pos + m

    @staticmethod
    def _common(tokens: list[int], pos: int, key: list[int]) -> int:
        return common_prefix(tokens[pos:pos + len(key)], key)

    def promote(self, node: Node, pages: list[int]) -> None:
        """Make a demoted node (whose parent is resident) resident in `pages` (fresh, refcount 1,
        one per page of the node) by copying its tier entry back; the entry is kept."""
        assert self.tier is not None and node.host is not None, "only a demoted node is promoted (a tier copy)"
        self.tier.load(node.host, pages)
        node.pages = list(pages)
        self._tick(node)
