"""KV per token out of and into the paged store: what a snapshot (kv/branching.py) and the disk
tier (kv/disk.py, kv/hierarchy.py) hold is independent of the page size and page ids of the
engine that wrote it."""

from __future__ import annotations

import numpy as np
import torch

from agentrt.kv.store import KVStore

_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # (numpy has no bfloat16)


def gather_kv(store: KVStore, pages: list[int], a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of token positions [a, b) of the tokens on `pages` (pages[0] holding position 0),
    as host tensors [layers, b - a, Hkv, D] (store.host_device; copies: the store goes on
    changing after this returns). Off the CPU the slots are indexed on the store's device (its
    page map's device copy: kv/store.py::PageMap). On the CPU it runs
    no torch op (numpy gathers): a thread beside the step loop (the disk tier's writer) must not
    start an OpenMP pool of its own, which would slow every later step (kernels/native.py)."""
    if store.device.type != "cpu":
        def one(caches):
            return torch.stack([_flat(t).index_select(0, _slots(store, i, pages, b)[a:])
                                for i, t in enumerate(caches)]).to(store.host_device)
        return one(store.k), one(store.v)
    ps, pos = store.page_size, np.arange(a, b)
    rows = [np.asarray([store.row(i, p) for p in pages], dtype=np.int64) for i in range(len(store.k))]
    slots = [r[pos // ps] * ps + pos % ps for r in rows]

    def host(caches):
        t0 = caches[0]
        flat = [t.view(_AS_INT[t.element_size()]).numpy().reshape(-1, *t.shape[2:]) for t in caches]
        out = np.stack([f[s] for f, s in zip(flat, slots)])
        return torch.from_numpy(out).view(t0.dtype)
    return host(store.k), host(store.v)


def scatter_kv(store: KVStore, pages: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
    """Write K and V ([layers, n, Hkv, D]) of token positions [0, n) into `pages`."""
    n = k.shape[1]
    for i, (dst, src) in enumerate(zip(store.k + store.v, list(k) + list(v))):
        slots = _slots(store, i % len(store.k), pages, n)
        _flat(dst).index_copy_(0, slots, src.to(dst.device, dst.dtype))


def _flat(cache: torch.Tensor) -> torch.Tensor:
    """[pages, page_size, Hkv, D] -> a [pages * page_size, Hkv, D] view (one row per slot)."""
    return cache.view(-1, *cache.shape[2:])


def _slots(store: KVStore, layer: int, pages: list[int], n: int) -> torch.Tensor:
    """Slot (row of _flat) of `layer` for each of the first n token positions on `pages`."""
    ps, device = store.page_size, store.device
    pos = torch.arange(n, device=device)
    table = store.rows(layer, torch.tensor(pages, dtype=torch.long, device=device))
    return table[pos // ps] * ps + pos % ps
