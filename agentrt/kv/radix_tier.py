"""The radix tree's moves between the KV pool and the second tier (kv/tier.py): a resident
leaf leaves the pool (`discard`: demoted, or dropped with its demoted subtree), the tier makes
room (`make_room`: kept copies first, then demoted leaves in policy order), a match's demoted
continuation is found (`host_path`) and copied back (`promote`). A mixin of `RadixCache`: it
uses the tree's allocator, policy, tier, page size and node walk."""

from __future__ import annotations

from agentrt.prefixes import common_prefix


class TierMoves:
    def discard(self, leaf) -> int:
        """Take a resident leaf out of the pool: demoted to the tier when it has room, else
        dropped with its (demoted) subtree. Returns pages freed."""
        before = self.alloc.num_free
        n = len(leaf.pages)
        if self.tier is not None and self._demote(leaf):
            self.demoted_pages += n
        else:
            self.dropped_pages += n
            self._drop(leaf)
        return self.alloc.num_free - before

    def _demote(self, leaf) -> bool:
        if leaf.host is None:  # (a promoted node kept its copy: nothing to write)
            if not self.make_room(len(leaf.pages), keep=leaf):
                return False
            leaf.host = self.tier.save(leaf.pages)
        self.alloc.decref(leaf.pages)
        leaf.pages, leaf.prefetched = [], False
        return True

    def make_room(self, n_pages: int, keep=None) -> bool:
        """Free tier room for n_pages: first the kept copies of resident nodes (oldest first),
        then demoted leaves (policy order); never a locked node or `keep`."""
        tier = self.tier
        if n_pages > tier.capacity_pages:
            return False
        if tier.free_pages() >= n_pages:
            return True
        copies = sorted((x for x in self._nodes() if x.resident and x.host is not None and x is not keep),
                        key=lambda x: x.last_access)
        leaves = [x for x in self._nodes() if not x.resident and x.parent is not None and not x.children
                  and x.lock_ref == 0 and x is not keep]
        for x in copies:
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

    def _drop(self, node) -> None:
        """Remove node and its subtree from the tree, the pool and the tier."""
        del node.parent.children[tuple(node.key[:self.ps])]
        stack = [node]
        while stack:
            x = stack.pop()
            stack.extend(x.children.values())
            self.alloc.decref(x.pages)
            if x.host is not None:
                self.tier.release(x.host)
            x.pages, x.host = [], None

    def host_path(self, tokens: list[int], salt: str | None = None) -> list:
        """The demoted nodes that continue the resident match of `tokens`, top-down (each
        matches at least its first page; the last may match only part of its key)."""
        node, pos, path = self._root(salt), 0, []
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

    def promote(self, node, pages: list[int]) -> None:
        """Make a demoted node (whose parent is resident) resident in `pages` (fresh, refcount 1,
        one per page of the node) by copying its tier entry back; the entry is kept."""
        self.tier.load(node.host, pages)
        node.pages = list(pages)
        self._tick(node)
