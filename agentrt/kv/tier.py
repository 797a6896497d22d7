"""The second KV tier: whole pages copied out of the KV pool instead of being dropped.

When memory is short, a radix node's pages are *demoted*: their K and V (every layer) are copied
into a `TierEntry` here and the pool pages are freed; the node stays in the tree, marked as held
by the tier. A later request whose prefix runs through it *promotes* it (fresh pool pages, one
copy back) instead of recomputing it -- when the copy is the cheaper of the two. Both costs are
measured on this machine: the copy at start (`copy_s_per_page`), the recompute from the step
loop's own prefill timings (`CostModel`).

On a GPU the tier lives in pinned host memory (copies overlap with compute). On a CPU the pool
and the tier are both host RAM, so what the tier buys is a separate byte budget
(`EngineConfig.kv_tier_bytes`) and a copy that costs ~1/100 of a recompute; entries are dense
tensors (no page padding, no page table), sized exactly to what they hold.

A promoted node keeps its tier copy while the budget allows (a second demotion of the same,
immutable full pages then costs nothing); `RadixCache` drops those copies first when it needs
room. All methods run in the engine's step thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from agentrt.kv.store import KVStore
from agentrt.kv.window import LocalPages


@dataclass(eq=False)
class TierEntry:
    """K and V of `n_pages` whole pages, every layer: [layers, n_pages, page_size, Hkv, D]."""

    k: torch.Tensor
    v: torch.Tensor
    absent: tuple[int, ...] = ()  # pages whose sliding-window layers' KV had been released

    @property
    def n_pages(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def split(self, i: int) -> tuple["TierEntry", "TierEntry"]:
        """The first i pages and the rest, as separate copies (the byte count stays exact)."""
        return (TierEntry(self.k[:, :i].clone(), self.v[:, :i].clone(), tuple(a for a in self.absent if a < i)),
                TierEntry(self.k[:, i:].clone(), self.v[:, i:].clone(), tuple(a - i for a in self.absent if a >= i)))


class HostTier:
    """A byte budget of demoted pages. Bookkeeping only counts what entries hold; which entry
    to drop when full is the radix tree's choice (it knows the tree shape and the policy)."""

    def __init__(self, store: KVStore, budget_bytes: int):
        self.store, self.budget = store, int(budget_bytes)
        k0 = store.k[0]
        self.page_bytes = 2 * len(store.k) * k0[0].numel() * k0.element_size()
        self.used = 0  # bytes held by live entries
        self._pin = store.device.type == "cuda"
        self.local: LocalPages | None = None  # the sliding-window layers' pool (kv/window.py), set by its owner
        self.copy_s_per_page = self._measure_copy()

    @property
    def capacity_pages(self) -> int:
        return self.budget // self.page_bytes

    def free_pages(self) -> int:
        return (self.budget - self.used) // self.page_bytes

    def save(self, pages: list[int]) -> TierEntry:
        """Copy pool pages into a new entry (the caller made room: free_pages() >= len(pages))."""
        store = self.store
        idx = torch.tensor(pages, dtype=torch.long, device=store.device)  # (store.rows indexes on the device)
        shape = (len(store.k), len(pages), *store.k[0].shape[1:])  # [layers, n, page_size, Hkv, D]
        k = torch.empty(shape, dtype=store.k[0].dtype, device=store.host_device, pin_memory=self._pin)
        v = torch.empty(shape, dtype=store.k[0].dtype, device=store.host_device, pin_memory=self._pin)
        for layer, (kl, vl) in enumerate(zip(self.store.k, self.store.v)):
            rows = self.store.rows(layer, idx)
            k[layer].copy_(kl.index_select(0, rows), non_blocking=self._pin)
            v[layer].copy_(vl.index_select(0, rows), non_blocking=self._pin)
        absent = () if self.local is None else tuple(i for i, p in enumerate(pages) if not self.local.present(p))
        entry = TierEntry(k, v, absent)
        self.used += entry.nbytes
        return entry

    def load(self, entry: TierEntry, pages: list[int]) -> None:
        """Copy an entry back into pool pages (len(pages) == entry.n_pages)."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.store.device)
        for layer, (kl, vl) in enumerate(zip(self.store.k, self.store.v)):
            rows = self.store.rows(layer, idx)
            kl.index_copy_(0, rows, entry.k[layer].to(kl.device, non_blocking=self._pin))
            vl.index_copy_(0, rows, entry.v[layer].to(vl.device, non_blocking=self._pin))
        for i in entry.absent:  # (released before it left: released again, never read)
            if self.local is not None:  # (an entry has absent pages only with a local pool)
                self.local.detach(pages[i])

    def adopt(self, entry: TierEntry) -> None:
        """Count an entry made outside save() (a split's halves)."""
        self.used += entry.nbytes

    def release(self, entry: TierEntry) -> None:
        self.used -= entry.nbytes

    def _measure_copy(self) -> float:
        """Seconds to copy one page out and back, on this machine (best of 3 small runs)."""
        n = min(4, self.store.num_pages)
        pages, best = list(range(n)), float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            e = self.save(pages)
            self.load(e, pages)  # the same bytes back: the pool's contents do not change
            self.release(e)
            best = min(best, time.perf_counter() - t0)
        return best / n

    def check_invariants(self, entries: list[TierEntry]) -> None:
        total = sum(e.nbytes for e in entries)
        if total != self.used:
            raise AssertionError(f"tier counts {self.used} bytes but its entries hold {total}")
        if self.used > self.budget:
            raise AssertionError(f"tier holds {self.used} bytes over its budget of {self.budget}")


class CostModel:
    """Seconds per recomputed prompt token, learned from the step loop's prefill-heavy steps
    (an EMA; the prior is deliberately cheap, so until the first measurement a copy must beat a
    fast recompute to be chosen); and the seconds of a decode-only step as a line in the
    number of sequences it decodes, `decode_s(n) = base + per_seq * n` (EMA-weighted least
    squares over the steps seen; one batch size seen: its mean, flat). On a GPU the line is
    nearly flat (a step reads the weights once for every row); on a CPU each row adds work."""

    def __init__(self, prior_s_per_token: float = 5e-5, alpha: float = 0.2):
        self.s_per_token, self.alpha, self.samples = prior_s_per_token, alpha, 0
        self.decode_step_s = 0.0  # the latest decode-only steps' EMA (0: none seen yet)
        self._m = [0.0, 0.0, 0.0, 0.0]  # EMAs of n, seconds, n*n, n*seconds
        self.decode_base_s = self.decode_per_seq_s = 0.0

    def observe(self, seconds: float, tokens: int, seqs: int = 1) -> None:
        """A step of `seconds` that fed `tokens` prefill tokens (0: decodes only) for `seqs`
        sequences."""
        if tokens == 0:
            self._observe_decode(seconds, max(1, seqs))
            return
        if tokens < 32:  # decode-dominated steps say little about prefill cost
            return
        x = seconds / tokens
        self.s_per_token = x if self.samples == 0 else (1 - self.alpha) * self.s_per_token + self.alpha * x
        self.samples += 1

    def _observe_decode(self, seconds: float, n: int) -> None:
        d, m, a = self.decode_step_s, self._m, self.alpha
        self.decode_step_s = seconds if d == 0.0 else (1 - a) * d + a * seconds
        x = (n, seconds, n * n, n * seconds)
        self._m = list(x) if d == 0.0 else [(1 - a) * mi + a * xi for mi, xi in zip(m, x)]
        mn, ms, mnn, mns = self._m
        var = mnn - mn * mn
        slope = (mns - mn * ms) / var if var > 1e-6 else 0.0
        self.decode_per_seq_s = max(0.0, slope)
        self.decode_base_s = max(0.0, ms - self.decode_per_seq_s * mn)

    def decode_s(self, n: int) -> float:
        """Seconds of one decode-only step over n sequences (0: none seen yet)."""
        return self.decode_base_s + self.decode_per_seq_s * n if self.decode_step_s else 0.0

    def recompute_s(self, tokens: int) -> float:
        return tokens * self.s_per_token
