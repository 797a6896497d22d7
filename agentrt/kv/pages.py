"""Refcounted KV pages. Pages are allocated once (the KVStore tensors); this class only keeps
the bookkeeping: a free list and a refcount per page. Holders (sequences, the radix tree) own
one reference per page they list; a page returns to the free list when its count drops to 0."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable


class OutOfPages(Exception):
    """Internal signal: fewer free pages than asked for (the scheduler evicts or preempts)."""


class PageAllocator:
    """`local`: the sliding-window layers' page pool (kv/window.py), for models that have such
    layers: a fresh page takes a local page too, and a freed one gives it back."""

    def __init__(self, num_pages: int, page_size: int, local=None):
        self.num_pages, self.page_size, self.local = num_pages, page_size, local
        self._ref = [0] * num_pages
        self._free: deque[int] = deque(range(num_pages))
        self.allocated = 0  # pages handed out by alloc() since the start (monotonic)

    @property
    def num_free(self) -> int:
        """Pages alloc() can hand out now (the smaller of the two pools where there are two)."""
        return len(self._free) if self.local is None else min(len(self._free), self.local.num_free)

    @property
    def num_used(self) -> int:
        """Logical pages held (occupancy of the whole-history pool)."""
        return self.num_pages - len(self._free)

    def refcount(self, page: int) -> int:
        return self._ref[page]

    def alloc(self, n: int) -> list[int]:
        """n fresh pages with refcount 1; raises OutOfPages (allocating nothing) if short."""
        if n > self.num_free:
            raise OutOfPages(f"need {n} pages, {self.num_free} free")
        pages = [self._free.popleft() for _ in range(n)]
        if self.local is not None:
            self.local.attach(pages)
        for p in pages:
            self._ref[p] = 1
        self.allocated += n
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        for p in pages:
            if self._ref[p] <= 0:
                raise RuntimeError(f"incref of free page {p}")
            self._ref[p] += 1

    def decref(self, pages: Iterable[int]) -> None:
        for p in pages:
            if self._ref[p] <= 0:
                raise RuntimeError(f"decref of free page {p}")
            self._ref[p] -= 1
            if self._ref[p] == 0:
                self._free.append(p)
                if self.local is not None:
                    self.local.detach(p)

    def check_invariants(self, holders: Iterable[Iterable[int]]) -> None:
        """Each page is free xor referenced, and refcounts equal the references `holders` list."""
        counted = Counter(p for pages in holders for p in pages)
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("a page is on the free list twice")
        for p in range(self.num_pages):
            if (p in free) == (self._ref[p] > 0):
                raise AssertionError(f"page {p}: free={p in free} refcount={self._ref[p]}")
            if counted.get(p, 0) != self._ref[p]:
                raise AssertionError(f"page {p}: refcount {self._ref[p]} but {counted.get(p, 0)} holders")
        if self.local is not None:
            self.local.check_invariants(self.num_pages, self.refcount)
