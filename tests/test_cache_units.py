"""Unit tests of the cache layer: pages, copy-on-write, radix tree, eviction, pool."""

from __future__ import annotations

import threading

import anyio
import pytest
import torch

from agentrt.engine.seq_ids import SequencePool
from agentrt.errors import ConfigError, PoolExhausted
from agentrt.kv.eviction import LRUPolicy
from agentrt.kv.kv_manager import KVManager, Sequence
from agentrt.kv.pages import OutOfPages, PageAllocator
from agentrt.kv.radix import RadixCache
from agentrt.kv.store import KVStore
from agentrt.model.config import ModelConfig

PS = 4
CFG = ModelConfig(arch="llama", vocab_size=50, hidden_size=8, intermediate_size=16, num_layers=2,
                  num_heads=2, num_kv_heads=1, head_dim=4)


def _kvm(pages=16):
    alloc = PageAllocator(pages, PS)
    return alloc, KVManager(alloc, KVStore.allocate(CFG, pages, PS))


def test_alloc_is_all_or_nothing_and_refcounts_free_pages():
    alloc = PageAllocator(4, PS)
    a = alloc.alloc(3)
    with pytest.raises(OutOfPages):
        alloc.alloc(2)
    assert alloc.num_free == 1
    alloc.incref(a[:1])
    alloc.decref(a)
    assert alloc.num_free == 3
    alloc.check_invariants([a[:1]])
    with pytest.raises(AssertionError):
        alloc.check_invariants([])


def test_alias_is_metadata_only_and_copy_on_write_on_shared_partial_page():
    alloc, kvm = _kvm()
    donor = Sequence(0)
    kvm.prepare_write(donor, 6)  # 2 pages
    donor.tokens = [1, 2, 3, 4, 5, 6]
    kvm.store.k[0][donor.pages[1]].fill_(7.0)
    child = Sequence(1)
    kvm.alias(child, donor.tokens[:5], donor.pages)  # shares page 1, partially (1 token)
    assert child.pages == donor.pages and alloc.refcount(donor.pages[1]) == 2
    kvm.prepare_write(child, 7)  # child writes position 5 into the shared page -> copy
    assert child.pages[0] == donor.pages[0] and child.pages[1] != donor.pages[1]
    assert torch.equal(kvm.store.k[0][child.pages[1]], kvm.store.k[0][donor.pages[1]])
    alloc.check_invariants([donor.pages, child.pages])
    kvm.release(child)
    kvm.release(donor)
    assert alloc.num_free == 16


def test_radix_splits_matches_partial_pages_and_isolates_salts():
    alloc, kvm = _kvm()
    tree = RadixCache(alloc)
    a = Sequence(0)
    kvm.prepare_write(a, 12)
    toks = list(range(100, 112))
    assert tree.insert(toks + [1, 2], a.pages) == 12  # the partial last page is not cached
    m = tree.match_prefix(toks[:8] + [9, 9, 9])
    assert m.length == 8 and m.pages == a.pages[:2]
    m = tree.match_prefix(toks[:10] + [0])  # ends inside the third page
    assert m.length == 10 and m.pages == a.pages[:3]
    b = Sequence(1)
    kvm.prepare_write(b, 12)
    assert tree.insert(toks[:4] + [5] * 8, b.pages) == 8  # splits after the first page
    assert tree.match_prefix(toks[:4] + [5] * 8).pages == [a.pages[0]] + b.pages[1:]
    assert tree.match_prefix(toks, salt="tenant-b").length == 0
    tree.check_invariants()
    alloc.check_invariants([a.pages, b.pages, tree.all_pages()])


def test_radix_evicts_lru_leaves_but_never_locked_ones():
    alloc, kvm = _kvm(8)
    tree = RadixCache(alloc, LRUPolicy())
    seqs = []
    for i in range(3):
        s = Sequence(i)
        kvm.prepare_write(s, 8)
        tree.insert([i * 10 + j for j in range(8)], s.pages)
        kvm.release(s)  # now only the tree holds them
        seqs.append(s)
    assert alloc.num_free == 2
    tree.match_prefix(list(range(8)))  # touch sequence 0: most recent
    locked = tree.match_prefix([10 + j for j in range(8)])
    tree.lock(locked.node)
    assert tree.evict(2) == 2  # sequence 2 (least recent, unlocked) goes first
    assert tree.match_prefix([20 + j for j in range(8)]).length == 0
    assert tree.evict(100) == 2  # only sequence 0 is left to evict; 1 is locked
    assert tree.match_prefix([10 + j for j in range(8)]).length == 8
    tree.unlock(locked.node)
    tree.check_invariants()
    alloc.check_invariants([tree.all_pages()])


def test_pool_regions_timeout_and_release():
    pool = SequencePool(2, 1)
    a, b = pool.acquire("transient"), pool.acquire("transient")
    assert {a, b} == {0, 1} and pool.acquire("session") == 2
    with pytest.raises(PoolExhausted):
        pool.acquire("transient", timeout=0.05)
    threading.Timer(0.05, pool.release, args=(a,)).start()
    assert pool.acquire("transient", timeout=5) == a
    with pytest.raises(ConfigError):
        pool.acquire("bogus")
    pool.release(a)
    with pytest.raises(RuntimeError):
        pool.release(a)
    with pytest.raises(KeyError):
        with pool.lease("transient", 0.01):
            raise KeyError("the lease is returned on every exit path")
    pool.check_invariants({b, 2})


def test_pool_async_acquire_is_cancel_safe():
    pool = SequencePool(1, 0)
    held = pool.acquire("transient")

    async def main():
        with anyio.move_on_after(0.05):  # cancelled while waiting: must hold nothing
            await pool.acquire_async("transient")
        with pytest.raises(PoolExhausted):
            await pool.acquire_async("transient", timeout=0.02)
        pool.release(held)
        return await pool.acquire_async("transient", timeout=1)

    assert anyio.run(main) == held
    pool.release(held)
    pool.check_invariants(set())
