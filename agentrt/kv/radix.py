"""Token-level radix tree over KV pages, with page-granular sharing.

Each node holds a run of tokens and the pages that hold their KV; node boundaries fall on page
boundaries and only *full* pages are inserted. Why: a page is the unit of refcounting, and the
last, partially filled page of a sequence is still being written by its owner; caching it would
force a copy on every append. A match may still end *inside* a cached full page: the caller then
aliases that page for the matched tokens and copies it on its first write (copy-on-write in
KVManager.prepare_write), so token-granular hits cost one page copy at most.

The tree holds one reference on each page it lists. `lock` marks a path as in use by a request;
locked nodes are never evicted (evicting them would free nothing while the request holds refs).
Each cache_salt gets its own root, so tenants never share KV.

With a second tier (`kv/tier.py`) a node is *resident* (pool pages), *demoted* (no pages;
its KV in a tier entry) or both (promoted, the tier copy kept). Resident nodes form a top
subtree: a demoted node's children are demoted. Matching walks resident nodes only; the
demoted continuation of a match (`host_path`) is promoted by the caller (kv/hierarchy.py).
Which leaf goes is the caller's choice too (`resident_leaves`, `discard`), so sessions and the
tree are ranked together; `evict()` is the tree-only form of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from agentrt.kv.eviction import EvictionPolicy, LRUPolicy
from agentrt.kv.identity import RootKey
from agentrt.kv.pages import PageAllocator
from agentrt.kv.radix_node import Node
from agentrt.kv.radix_tier import TierMoves
from agentrt.kv.tier import HostTier, TierEntry
from agentrt.prefixes import common_prefix


class PrefixMatch(NamedTuple):
    length: int  # matched tokens (may end inside the last page)
    pages: list[int]  # pages covering tokens [0, length): ceil(length / page_size) of them
    node: Node  # deepest node on the match path (lock it while the pages are used)


class RadixCache(TierMoves):
    def __init__(self, allocator: PageAllocator, policy: EvictionPolicy | None = None,
                 tier: HostTier | None = None):
        self.alloc, self.ps = allocator, allocator.page_size
        self.policy = policy or LRUPolicy()
        self.tier = tier
        self._roots: dict[RootKey, Node] = {}
        self._clock = 0
        self.demoted_pages = self.dropped_pages = 0  # counters (pages moved out / lost)
        self.prefetch_used_pages = 0  # prefetched pages a match reached (counted once)

    def _root(self, salt: RootKey) -> Node:
        return self._roots.setdefault(salt, Node())

    def _tick(self, node: Node) -> None:
        self._clock += 1
        up: Node | None = node
        while up is not None:
            up.last_access = self._clock
            up = up.parent

    def _page_match(self, tokens: list[int], pos: int, key: list[int], kpos: int) -> int:
        """Equal tokens of tokens[pos:] and key[kpos:] within one page (0..page_size)."""
        return common_prefix(tokens[pos:pos + self.ps], key[kpos:kpos + self.ps])

    def match_prefix(self, tokens: list[int], salt: RootKey = None) -> PrefixMatch:
        """Longest cached prefix of `tokens`. Does not change the tree's shape; refreshes the
        access time of the matched path. Pages are valid only while the caller holds refs."""
        node, pos = self._root(salt), 0
        pages: list[int] = []
        while True:
            child = node.children.get(tuple(tokens[pos:pos + self.ps]))
            if child is None or not child.resident:
                return self._finish_partial(tokens, pos, pages, node)
            if child.prefetched:
                child.prefetched = False
                self.prefetch_used_pages += child.num_pages
            i = 0
            while i < child.num_pages:
                m = self._page_match(tokens, pos, child.key, i * self.ps)
                if m < self.ps:
                    if m:
                        pages.append(child.pages[i])
                    self._tick(child)
                    return PrefixMatch(pos + m, pages, child if i or m else node)
                pages.append(child.pages[i])
                pos, i = pos + self.ps, i + 1
            node = child

    def peek(self, tokens: list[int], salt: RootKey = None) -> int:
        """Tokens of `tokens` whose KV the pool holds now, in whole pages. A read: no access
        time changes, nothing is locked (schedulers ask it of requests they may not admit)."""
        node, pos, ps = self._roots.get(salt), 0, self.ps
        while node is not None:
            child = node.children.get(tuple(tokens[pos:pos + ps]))
            if child is None or not child.resident:
                break
            i = 0
            while i < child.num_pages and tokens[pos:pos + ps] == child.key[i * ps:(i + 1) * ps]:
                pos, i = pos + ps, i + 1
            node = child if i == child.num_pages else None
        return pos

    def _finish_partial(self, tokens: list[int], pos: int, pages: list[int], node: Node) -> PrefixMatch:
        best, best_child = 0, None
        for child in node.children.values():
            if not child.resident:
                continue
            m = self._page_match(tokens, pos, child.key, 0)
            if m > best:
                best, best_child = m, child
        if best_child is not None:
            pages.append(best_child.pages[0])
            node = best_child
        self._tick(node)
        self.policy.on_access(node)
        return PrefixMatch(pos + best, pages, node)

    def insert(self, tokens: list[int], pages: list[int], salt: RootKey = None,
               tag: str | None = None) -> int:
        """Cache the full pages of `tokens` (pages[i] holds tokens [i*ps, (i+1)*ps)). Pages the
        tree already has for the same tokens are kept; the tree increfs the ones it adopts (a
        demoted node on the path becomes resident again with the caller's freshly computed
        pages). Returns how many tokens were newly cached."""
        n_full = min(len(tokens) // self.ps, len(pages))
        node, pos = self._root(salt), 0
        while pos < n_full * self.ps:
            first = tuple(tokens[pos:pos + self.ps])
            child = node.children.get(first)
            if child is None:
                return self._add_leaf(node, tokens[pos:n_full * self.ps], pages[pos // self.ps:n_full], tag)
            i, size = 0, self._size(child)
            while i < size and pos < n_full * self.ps and \
                    tokens[pos:pos + self.ps] == child.key[i * self.ps:(i + 1) * self.ps]:
                pos, i = pos + self.ps, i + 1
            if i < size:
                child = self._split(child, i)
            if not child.resident:  # recomputed by the caller: adopt its pages
                child.pages = list(pages[child.start // self.ps:pos // self.ps])
                self.alloc.incref(child.pages)
            node = child
        self._tick(node)
        return 0

    def _add_leaf(self, parent: Node, key: list[int], pages: list[int], tag: str | None) -> int:
        leaf = Node(key=list(key), pages=list(pages), parent=parent, tag=tag,
                    start=parent.start + len(parent.key))
        parent.children[tuple(key[:self.ps])] = leaf
        self.alloc.incref(leaf.pages)
        self._tick(leaf)
        self.policy.on_insert(leaf)
        return len(key)

    def _split(self, node: Node, i: int) -> Node:
        """Split `node` (not a root) after its i-th page; returns the new upper half."""
        assert node.parent is not None, "a radix root has no key to split"
        cut = i * self.ps
        upper = Node(key=node.key[:cut], pages=node.pages[:i], parent=node.parent,
                     lock_ref=node.lock_ref, last_access=node.last_access, tag=node.tag, start=node.start,
                     prefetched=node.prefetched)
        if node.host is not None:
            tier = self.tier
            assert tier is not None, "a node has a tier copy only in a tree with a tier"
            tier.release(node.host)
            upper.host, node.host = node.host.split(i)
            tier.adopt(upper.host)
            tier.adopt(node.host)
        node.parent.children[tuple(upper.key[:self.ps])] = upper
        node.key, node.pages, node.parent = node.key[cut:], node.pages[i:], upper
        node.start = upper.start + cut
        upper.children[tuple(node.key[:self.ps])] = node
        return upper

    def lock_match(self, m: PrefixMatch) -> Node:
        """Lock the path a match uses, splitting its last node after the pages the match
        covers: a match ending early in a long node must not pin the node's other pages.
        Returns the locked node (unlock it when done)."""
        node = m.node
        k = -(-(m.length - node.start) // self.ps)
        if node.parent is not None and 0 < k < self._size(node):
            node = self._split(node, k)
        self.lock(node)
        return node

    def lock(self, node: Node) -> None:
        up: Node | None = node
        while up is not None:
            up.lock_ref += 1
            up = up.parent

    def unlock(self, node: Node) -> None:
        up: Node | None = node
        while up is not None:
            if up.lock_ref <= 0:
                raise RuntimeError("radix unlock without lock")
            up.lock_ref -= 1
            up = up.parent

    def evict(self, num_pages: int) -> int:
        """Tree-only eviction: unlocked resident leaves that would free a page, in policy order,
        demoted to the tier (or dropped) until `num_pages` pages are free or none is left.
        Returns pages freed. (The engine ranks sessions' tails with these: kv/memory.py.)"""
        freed = 0
        while freed < num_pages:
            # a leaf whose pages live sequences (sessions) still hold would free nothing now:
            # it stays, so its prefix is still found when that session is detached or reused
            leaves = [n for n in self.resident_leaves() if any(self.alloc.refcount(p) == 1 for p in n.pages)]
            if not leaves:
                break
            for leaf in self.policy.victim_order(leaves):
                freed += self.discard(leaf)
                if freed >= num_pages:
                    break
        return freed

    def resident_leaves(self) -> list[Node]:
        """Unlocked resident nodes without resident children: what can leave the pool next."""
        return [n for n in self._nodes() if n.parent is not None and n.resident and n.lock_ref == 0
                and not any(c.resident for c in n.children.values())]

    def _nodes(self) -> Iterator[Node]:
        stack = list(self._roots.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def nodes(self) -> Iterator[Node]:
        """Every node, roots included (read-only use: policies, the engine's memory manager)."""
        return self._nodes()

    def all_pages(self) -> list[int]:
        return [p for n in self._nodes() for p in n.pages]

    def evictable_pages(self) -> int:
        """Pages that eviction could free now: unlocked and held by nobody but the tree."""
        return sum(1 for n in self._nodes() if n.lock_ref == 0
                   for p in n.pages if self.alloc.refcount(p) == 1)

    def check_invariants(self) -> None:
        entries: list[TierEntry] = []
        owner: dict[int, Node] = {}
        for n in self._nodes():
            for p in n.pages:  # a page holds one run of tokens: one node lists it
                if owner.setdefault(p, n) is not n:
                    raise AssertionError(f"radix page {p} is listed by two nodes (tags {owner[p].tag!r}, {n.tag!r}, "
                                         f"starts {owner[p].start}, {n.start})")
            if n.resident and len(n.key) != len(n.pages) * self.ps:
                raise AssertionError("radix node key/pages length mismatch")
            if n.host is not None:
                entries.append(n.host)
                if n.host.n_pages * self.ps != len(n.key):
                    raise AssertionError("radix node's tier copy does not cover its key")
            elif not n.resident and n.parent is not None:
                raise AssertionError("radix node neither resident nor in the tier")
            if n.lock_ref < sum(c.lock_ref for c in n.children.values()):
                raise AssertionError("radix lock_ref smaller than its children's")
            for k, c in n.children.items():
                if c.parent is not n or tuple(c.key[:self.ps]) != k or not c.key:
                    raise AssertionError("radix child link broken")
                if c.start != n.start + len(n.key):
                    raise AssertionError("radix node start is not its parent's end")
                if c.resident and not n.resident and n.parent is not None:
                    raise AssertionError("resident radix node under a demoted one")
        if self.tier is not None:
            self.tier.check_invariants(entries)
