"""Sequences' page tables over the shared page pool: aliasing, copy-on-write, truncation.

A Sequence's KV covers exactly `tokens` (positions 0 .. len(tokens)-1); `pages` lists the pages
that hold them, in order, and may have one more page reserved for upcoming writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrt.kv.identity import BASE, Adapted
from agentrt.kv.pages import PageAllocator
from agentrt.kv.store import KVStore


@dataclass(eq=False)
class Sequence:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # tokens whose KV is stored
    pages: list[int] = field(default_factory=list)
    slid: int = 0  # pages below this index were looked at by the window release (kv/window.py)
    adapted: Adapted = BASE  # the adapter that computed its KV, from which position (kv/identity.py)

    @property
    def num_cached(self) -> int:
        return len(self.tokens)


class KVManager:
    def __init__(self, allocator: PageAllocator, store: KVStore):
        self.alloc, self.store, self.ps = allocator, store, allocator.page_size

    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.ps)

    def write_cost(self, seq: Sequence, end: int) -> int:
        """Fresh pages prepare_write(seq, end) would take (new pages + copy-on-write copies)."""
        first = seq.num_cached // self.ps
        need = max(0, self.pages_for(end) - len(seq.pages))
        cow = sum(1 for p in seq.pages[first:self.pages_for(end)] if self.alloc.refcount(p) > 1)
        return need + cow

    def prepare_write(self, seq: Sequence, end: int) -> None:
        """Make positions [num_cached, end) writable: add pages, and copy every page in that
        range that is shared (refcount > 1) before it is written. All or nothing: raises
        OutOfPages without changing anything when the pool is short."""
        first = seq.num_cached // self.ps
        last = self.pages_for(end)
        shared = [i for i in range(first, min(last, len(seq.pages)))
                  if self.alloc.refcount(seq.pages[i]) > 1]
        fresh = self.alloc.alloc(max(0, last - len(seq.pages)) + len(shared))
        for i in shared:
            new = fresh.pop()
            self._copy_page(seq.pages[i], new)
            self.alloc.decref([seq.pages[i]])
            seq.pages[i] = new
        seq.pages.extend(fresh)

    def _copy_page(self, src: int, dst: int) -> None:
        for layer, (k, v) in enumerate(zip(self.store.k, self.store.v)):
            s, d = self.store.row(layer, src), self.store.row(layer, dst)
            k[d].copy_(k[s])
            v[d].copy_(v[s])
        if self.alloc.local is not None and not self.alloc.local.present(src):
            self.alloc.local.detach(dst)  # (a copy is as complete as its source)

    def valid_point(self, seq_pages: list[int], m: int) -> int:
        """The largest m' <= m a sequence on these pages can continue from (m itself unless a
        sliding-window layer's pages before m were released: kv/window.py)."""
        return m if self.alloc.local is None else self.alloc.local.valid_point(seq_pages, m)

    def truncate(self, seq: Sequence, n: int) -> None:
        """Keep the KV of the first n tokens; pages past them are released."""
        keep = self.pages_for(n)
        seq.slid = min(seq.slid, keep)
        self.alloc.decref(seq.pages[keep:])
        del seq.pages[keep:]
        del seq.tokens[n:]

    def alias(self, seq: Sequence, tokens: list[int], pages: list[int]) -> None:
        """Point an empty sequence at another holder's pages for `tokens`: metadata only, O(1)
        per page, independent of the tokens' content."""
        if seq.pages:
            raise RuntimeError("alias() needs an empty sequence; truncate it to 0 first")
        keep = pages[: self.pages_for(len(tokens))]
        self.alloc.incref(keep)
        seq.pages, seq.tokens, seq.slid = list(keep), list(tokens), 0

    def release(self, seq: Sequence) -> None:
        self.truncate(seq, 0)
