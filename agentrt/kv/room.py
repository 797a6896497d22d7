"""The KV room's state, built once by the engine core and handed to the KV helpers instead of the
core: the page allocator, the sequences' page tables over the executor's KV store, the radix tree
(and its tier), the eviction policy, the sessions (each holds one sequence), the recompute cost
model, and the memory manager that makes room among them.

What reads it: the memory hierarchy (kv/hierarchy.py), tool-aware retention (kv/retention.py),
branching (kv/branching.py), admission's prefix reuse (scheduling/prefix.py) and the core's
post-processing. The request queues are the scheduler's: making room asks it what is queued and
kept through plain facts (kv/memory.py::SchedulingFacts), and holds none of its structures.
"""

from __future__ import annotations

from collections.abc import Callable

from agentrt.config import EngineConfig
from agentrt.kv.eviction import as_eviction_policy
from agentrt.kv.identity import BASE, Adapted, space
from agentrt.kv.kv_manager import KVManager, Sequence
from agentrt.kv.memory import MemoryManager
from agentrt.kv.pages import PageAllocator
from agentrt.kv.radix import RadixCache
from agentrt.kv.sessions import EngineSession
from agentrt.kv.store import KVStore
from agentrt.kv.tier import CostModel, HostTier
from agentrt.kv.window import LocalPages, slide


class KVRoom:
    def __init__(self, cfg: EngineConfig, store: KVStore, policy, counters, clock,
                 make_tier: Callable[[KVStore], HostTier] | None = None):
        """`store`: the executor's KV store; `make_tier(store)`: the second tier over it (None:
        no tier); `policy`: the eviction policy (kv/registry.py)."""
        self.cfg, self.counters, self.clock = cfg, counters, clock
        local = None
        if store.local_of is not None:  # (the sliding-window layers' own pool: kv/window.py)
            rows = store.k[store.local_layers.index(True)].shape[0]
            local = LocalPages(store.local_of, rows, cfg.page_size, store.window)
        self.alloc = PageAllocator(cfg.num_pages, cfg.page_size, local)
        self.kvm = KVManager(self.alloc, store)
        self.policy = policy = as_eviction_policy(policy)
        tier = make_tier(store) if make_tier is not None and cfg.enable_radix_cache else None
        if tier is not None:
            tier.local = local
        self.radix = RadixCache(self.alloc, policy, tier) if cfg.enable_radix_cache else None
        self.costs = CostModel()
        self.sessions: dict[int, EngineSession] = {}
        self.mem = MemoryManager(cfg, self.alloc, self.kvm, self.radix, policy, counters,
                                 self.sessions, clock)

    @property
    def tier(self) -> HostTier | None:
        """The second KV tier (None without one)."""
        return self.radix.tier if self.radix is not None else None

    def open_session(self, seq_id: int, tag: str | None = None, cache_salt: str | None = None) -> EngineSession:
        """A new, empty session on pool id `seq_id`."""
        sess = EngineSession(seq_id, Sequence(seq_id), tag=tag, cache_salt=cache_salt)
        self.sessions[seq_id] = sess
        return sess

    def forget_session(self, sess: EngineSession) -> None:
        """Drop `sess` from the table (its pages are the caller's to release)."""
        del self.sessions[sess.sid]

    def insert_prefix(self, tokens, pages, salt, tag, adapted: Adapted = BASE) -> None:
        """Offer a sequence's KV (its tokens on `pages`, computed as `adapted`) to the radix tree
        (no-op without one): under its identity's key, and an aLoRA's KV before its start under
        the base model's too (it is the base model's KV: kv/identity.py)."""
        if self.radix is None or not tokens:
            return
        self.radix.insert(tokens, pages, space(salt, adapted), tag)
        if adapted.start and not adapted.base:
            self.radix.insert(tokens[:adapted.start], pages, salt, tag)

    def slide(self, running, turn_end=None) -> None:
        """Release the sliding-window layers' pages the running requests moved past (kv/window.py;
        not a leader's while its followers wait for the block it computes), and, at the end of
        a session's turn, those of its whole sequence the tree no longer needs (`turn_end`)."""
        if self.alloc.local is None:
            return
        leaders = {id(r.leader) for r in running if r.leader is not None}
        seqs = [r.seq for r in running if id(r) not in leaders]
        if turn_end is not None:
            turn_end.slid = 0
            seqs.append(turn_end)
        slide(seqs, self.alloc, self.alloc.local, self.radix)

    def evictable_pages(self) -> int:
        """Pages only the radix tree holds (what making room can take first)."""
        return self.radix.evictable_pages() if self.radix is not None else 0

    def check_invariants(self, holders: list[list[int]]) -> None:
        """Pages free xor held, refcounts equal to their holders (`holders`: the page lists of
        what lives outside the room, e.g. transient requests); the tree's and the policy's own
        invariants; every session's pages cover its tokens."""
        holders = holders + [s.seq.pages for s in self.sessions.values()]
        if self.radix is not None:
            self.radix.check_invariants()
            holders.append(self.radix.all_pages())
        self.policy.check_invariants()
        self.alloc.check_invariants(holders)
        for s in self.sessions.values():
            if len(s.seq.pages) < self.kvm.pages_for(s.seq.num_cached):
                raise AssertionError("session pages do not cover its tokens")

    def check_windows(self, running) -> None:
        """Every running request's next step finds its sliding-window layers' pages (kv/window.py):
        nothing it still reads was released."""
        for r in running:
            n = r.seq.num_cached
            if self.kvm.valid_point(r.seq.pages, n) != n:
                raise AssertionError(f"request {r.rid}: a page of its window at {n} tokens was released")
