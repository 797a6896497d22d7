"""KV per token out of and into the paged store: what a snapshot (kv/branching.py) and the disk
tier (kv/disk.py, kv/hierarchy.py) hold is independent of the page size and page ids of the
engine that wrote it."""

from __future__ import annotations

import torch


def gather_kv(store, pages: list[int], a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of token positions [a, b) of the sequence on `pages`, as CPU tensors [layers,
    b - a, Hkv, D] (copies: the store goes on changing after this returns)."""
    def one(caches):
        return torch.stack([_flat(t).index_select(0, _slots(store, i, pages, b)[a:]) for i, t in enumerate(caches)]).cpu()
    return one(store.k), one(store.v)


def scatter_kv(store, pages: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
    """Write K and V ([layers, n, Hkv, D]) of token positions [0, n) into `pages`."""
    n = k.shape[1]
    for i, (dst, src) in enumerate(zip(store.k + store.v, list(k) + list(v))):
        slots = _slots(store, i % len(store.k), pages, n)
        _flat(dst).index_copy_(0, slots, src.to(dst.device, dst.dtype))


def _flat(cache: torch.Tensor) -> torch.Tensor:
    """[pages, page_size, Hkv, D] -> a [pages * page_size, Hkv, D] view (one row per slot)."""
    return cache.view(-1, *cache.shape[2:])


def _slots(store, layer: int, pages: list[int], n: int) -> torch.Tensor:
    """Slot (row of _flat) of `layer` for each of the first n token positions on `pages`."""
    ps, device = store.page_size, store.k[layer].device
    pos = torch.arange(n, device=device)
    table = store.rows(layer, torch.tensor(pages, dtype=torch.long, device=device))
    return table[pos // ps] * ps + pos % ps
