"""Sliding-window layers' KV pages: released once every live sequence has slid past them.

A model whose layers attend a sliding window (Mistral, Gemma 2/3's local layers, Qwen2 with
`max_window_layers`) keeps two kinds of KV. Full-attention (global) layers need every position
for as long as a sequence lives; a local layer's query at position n reads keys from the
16-aligned block holding n + 1 - window only. So the pool keeps local layers apart:

* *logical* pages are what the allocator, the radix tree, sessions and the tier count, as for
  any model; a logical page's global-layer KV lives in the store at that page's row;
* a logical page's local-layer KV lives in a *local* page of its own, smaller, pool
  (`KVStore.local_of[page]`, -1 when it has none). A fresh logical page gets one; it is released
  when the logical page is freed, or earlier, when no holder needs it (`slide`).

Who needs a local page: a live sequence needs the pages its next query reads (its *window*);
the radix tree needs, for each leaf and each branch point (where another request's match
most likely ends), the pages of the window before that node's end. Pages held by a second
sequence stay (they are shared; the sequences slide past them too, and the last one frees
them). Everything else is released as its sequence moves on, so a session's local KV is
bounded by about its window (plus the window before its previous turn's end) however long
its history grows.

Which operations need the whole history: none but a continuation from an earlier point. A
sequence may continue from position m only if its window before m is still there
(`valid_point`): a session rolled back, or a cached prefix matched, past what was released is
cut further back to the last point that is, and the rest is computed again. Fork, snapshot and
the tier carry which local pages are missing (snapshots as a per-token mask; tier entries as a
per-page list), so what comes back is exactly as valid as what left.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable

from agentrt.config import EngineConfig
from agentrt.errors import ConfigError
from agentrt.kv.pages import OutOfPages
from agentrt.kv.store import PageMap

BLOCK = 16  # the attention kernels start a window's sums at this alignment


def window_start(n: int, window: int) -> int:
    """First key position the next query (at position n) of a sequence of n tokens reads."""
    return max(0, n + 1 - window) // BLOCK * BLOCK


class LocalPages:
    """The local pool: `num_local` pages and the map from logical pages to them."""

    def __init__(self, local_of: PageMap, num_local: int, page_size: int, window: int):
        self.local_of, self.page_size, self.window = local_of, page_size, window  # (the store's map)
        self.num_local = num_local
        self._free: deque[int] = deque(range(num_local))
        self.released = 0  # local pages released early (slid out of every window), monotonic

    @property
    def num_free(self) -> int:
        return len(self._free)

    def present(self, page: int) -> bool:
        return self.local_of[page] >= 0  # (the host copy: no device sync)

    def attach(self, pages: list[int]) -> None:
        """Fresh logical pages get local pages (the caller checked num_free)."""
        if len(pages) > len(self._free):
            raise OutOfPages(f"need {len(pages)} local pages, {len(self._free)} free")
        self.local_of.set(pages, [self._free.popleft() for _ in pages])

    def detach(self, page: int) -> None:
        """A logical page was freed (or slid out): its local page returns to the pool."""
        q = self.local_of[page]
        if q >= 0:
            self._free.append(q)
            self.local_of.set([page], [-1])

    def release_early(self, page: int) -> None:
        if self.present(page):
            self.detach(page)
            self.released += 1

    def first_needed(self, n: int) -> int:
        """Index of the first page the window of a sequence of n tokens reads."""
        return window_start(n, self.window) // self.page_size

    def valid_point(self, pages: list[int], m: int) -> int:
        """The largest m' <= m from which a sequence on `pages` can go on: every page of the
        window before m' still has its local KV (0 always can)."""
        while m > 0:
            hole = next((i for i in range(-(-m // self.page_size) - 1, self.first_needed(m) - 1, -1)
                         if not self.present(pages[i])), None)
            if hole is None:
                return m
            m = hole * self.page_size
        return 0

    def check_invariants(self, num_pages: int, refcount) -> None:
        """Local pages free xor mapped from exactly one live logical page; the map's device
        copy equals its host copy."""
        self.local_of.check()
        mapped = [(p, q) for p, q in enumerate(self.local_of.host.tolist()) if q >= 0]
        used = [q for _, q in mapped]
        if len(set(used)) != len(used) or set(used) & set(self._free):
            raise AssertionError("a local page is mapped twice, or mapped and free")
        if len(used) + len(self._free) != self.num_local or len(set(self._free)) != len(self._free):
            raise AssertionError("local pages lost or duplicated")
        if any(refcount(p) == 0 for p, _ in mapped):
            raise AssertionError("a free logical page still holds a local page")


def tree_needs(radix, window: int, page_size: int) -> tuple[set[int], set[int]]:
    """(pages the radix tree holds, those of them whose local KV it needs): the window before
    the end of every leaf and every branch point."""
    held, needed = set(), set()
    for node in radix.nodes():
        held.update(node.pages)
        kids = sum(1 for c in node.children.values() if c.resident)
        if node.parent is None or not node.resident or kids == 1:
            continue
        end = node.start + len(node.key)
        first = window_start(end, window) // page_size
        x = node
        while x is not None and x.parent is not None and x.start // page_size + len(x.pages) > first:
            needed.update(x.pages[max(0, first - x.start // page_size):])
            x = x.parent
    return held, needed


def slide(seqs: Iterable, alloc, local: LocalPages, radix) -> None:
    """Release the local pages `seqs` have slid past and nobody else needs. Each sequence's
    `slid` cursor remembers how far it was looked at (a page kept then because it was shared
    is looked at again only after the sequence's `slid` is reset, at its turn's end)."""
    tree = None
    for seq in seqs:
        cut = min(local.first_needed(len(seq.tokens)), len(seq.pages))
        for i in range(seq.slid, cut):
            p = seq.pages[i]
            if not local.present(p):
                continue
            extra = alloc.refcount(p) - 1
            if extra:
                if radix is None:
                    continue
                if tree is None:
                    tree = tree_needs(radix, local.window, local.page_size)
                if extra != (p in tree[0]) or p in tree[1]:
                    continue  # (another sequence holds it, or a cached prefix ends near it)
            local.release_early(p)
        seq.slid = max(seq.slid, cut)


def split_pool(cfg: EngineConfig, model_cfg) -> tuple[EngineConfig, int | None]:
    """(the engine config with the logical pool's size, local pages or None). The KV bytes
    stay those of `kv_cache_tokens` tokens of every layer; where the sliding-window layers
    need fewer (`window_kv_tokens`, or by default a batch's prefill plus 8 sequences'
    windows), the rest of their bytes go to the global layers' whole history (at most 8x)."""
    n = model_cfg.num_layers
    windows = [model_cfg.window(i) for i in range(n)]
    n_local, ps, total = sum(1 for w in windows if w > 0), cfg.page_size, cfg.kv_cache_tokens
    if not n_local:
        return cfg, None
    least = min(cfg.chunk_max, cfg.n_batch) + max(windows) + 2 * ps  # one prefill chunk's need
    if 0 < cfg.window_kv_tokens < least:
        raise ConfigError(f"EngineConfig.window_kv_tokens={cfg.window_kv_tokens} cannot hold one prefill chunk "
                          f"and its window ({least} tokens for chunk_max/n_batch {min(cfg.chunk_max, cfg.n_batch)}, "
                          f"window {max(windows)}): raise it to at least {least}, or leave it 0 (automatic)")
    want = cfg.window_kv_tokens or cfg.n_batch + 8 * (max(windows) + 2 * ps)
    local = -(-min(want, total) // ps) * ps
    if local >= total:
        return cfg, None  # (the windows span the pool: one pool, nothing to release)
    budget = total * n - local * n_local  # layer-tokens left for the global layers
    history = min(8 * total, budget // (n - n_local)) if n > n_local else 8 * total
    return dataclasses.replace(cfg, kv_cache_tokens=history // ps * ps), local // ps
