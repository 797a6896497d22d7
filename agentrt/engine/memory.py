"""Memory pressure inside a step. Order of remedies, cheapest first: free pages -> evict unlocked
radix leaves -> detach idle sessions (their KV goes to the radix cache, where it is evictable)
-> preempt the youngest running request (its KV is dropped and recomputed when it is
re-admitted). The engine's eviction policy (cache/base.py) orders both the leaves and the
sessions. Pinned session memory therefore can never starve the engine: an idle session only
keeps its KV while nobody else needs the pages."""

from __future__ import annotations

from agentrt.engine import scheduler as sched
from agentrt.engine.request import Request, State
from agentrt.errors import OutOfKVMemory

MAX_PREEMPTIONS = 32  # per request; beyond it the request fails instead of livelocking


class MemoryManager:
    def __init__(self, core):
        self.core = core

    def reclaim(self, n_pages: int) -> bool:
        """Try to have n_pages free, without touching running requests."""
        core, alloc = self.core, self.core.alloc
        if alloc.num_free >= n_pages:
            return True
        if core.radix is not None:
            core.counters.evicted_pages += core.radix.evict(n_pages - alloc.num_free)
        for s in self.detach_order():
            if alloc.num_free >= n_pages:
                break
            core._cache(s.seq.tokens, s.seq.pages, s.cache_salt, s.tag)
            core.kvm.release(s.seq)
            core.counters.detached_sessions += 1
            if core.radix is not None:
                core.counters.evicted_pages += core.radix.evict(n_pages - alloc.num_free)
        return alloc.num_free >= n_pages

    def detach_order(self) -> list:
        """Idle (or queued, unattached) sessions holding KV, the first to detach first (the eviction policy's order;
        least recently used for a policy without `order_sessions`)."""
        core = self.core
        # a session whose request still waits unattached holds nothing it needs yet: its KV
        # goes to the radix cache like an idle one's and is found again at admission
        queued = {id(r.session) for r in core.waiting if r.session is not None and not r.attached}
        idle = [s for s in core.sessions.values() if s.seq.pages and (not s.busy or id(s) in queued)]
        order = getattr(core.policy, "order_sessions", None)
        return order(idle) if order is not None else sorted(idle, key=lambda s: s.last_used)

    def fits(self, candidate: Request) -> bool:
        """Admission by footprint: the KV the running requests and the candidate hold (shared
        pages once; a busy session's history cannot be detached) plus the cells they may still
        add stays under the high-water mark. Without it, requests that cannot run together
        are admitted and preempt each other over and over. An idle engine always admits."""
        core = self.core
        if not core.running:
            return True
        group, ps = [*core.running, candidate], core.cfg.page_size
        held = {p for x in group for p in x.seq.pages}
        # new pages: whole pages for the cells to come, +1 for a shared partial page's copy
        new = sum(-(-sched.projected_cells(x) // ps) + 1 for x in group)
        return len(held) + new <= core.cfg.high_water * core.cfg.num_pages

    def reserve(self, r: Request, end: int, plan: dict, may_preempt: bool) -> bool:
        """Make r's positions up to `end` writable. With may_preempt, younger running requests
        (then r itself) are preempted until it fits; preempted requests leave `plan`."""
        core = self.core
        while True:
            if self.reclaim(core.kvm.write_cost(r.seq, end)):
                core.kvm.prepare_write(r.seq, end)
                return True
            if not may_preempt:
                return False
            victim = max(core.running, key=lambda x: x.admitted_at)
            self.preempt(victim)
            plan.pop(victim, None)
            if victim is r:
                return False

    def preempt(self, r: Request) -> None:
        """Drop r's KV and queue it again; a request preempted MAX_PREEMPTIONS times cannot fit
        beside what the pool must keep, and fails with OutOfKVMemory instead of looping."""
        core = self.core
        r.preemptions += 1
        if r.preemptions > MAX_PREEMPTIONS:
            core._finish(r, "error", error=OutOfKVMemory(
                f"request {r.rid} ({len(r.target)} tokens) was preempted {MAX_PREEMPTIONS} times: the KV pool "
                f"({core.cfg.kv_cache_tokens} tokens) cannot hold it beside the other running requests; raise "
                "EngineConfig.kv_cache_tokens or lower the concurrency"))
            core.counters.preemptions += 1
            return
        core.running.remove(r)
        self.drop_links(r)
        core.kvm.release(r.seq)
        r.state, r.attached = State.WAITING, False
        core.waiting.appendleft(r)
        core.counters.preemptions += 1

    def drop_links(self, r: Request) -> None:
        """Unlock r's radix path and cut leader/follower links that involve it."""
        if r.lock_node is not None:
            self.core.radix.unlock(r.lock_node)
            r.lock_node = None
        r.leader = None
        for f in self.core.running:
            if f.leader is r:
                f.leader = None

    def resolve_followers(self) -> None:
        """A follower whose leader now holds the shared block aliases it (metadata only)."""
        core = self.core
        for f in core.running:
            lead = f.leader
            if lead is None or lead.seq.num_cached < f.share_end:
                continue
            if f.lock_node is not None:
                core.radix.unlock(f.lock_node)
                f.lock_node = None
            core.kvm.release(f.seq)
            core.kvm.alias(f.seq, f.target[:f.share_end], lead.seq.pages)
            core.counters.grouped_tokens += f.share_end
            f.leader = None

    def over_high_water(self) -> bool:
        core = self.core
        used = core.alloc.num_pages - core.alloc.num_free
        if not sched.over_high_water(used, 0, core.cfg):
            return False  # the tree walk below is only needed near the mark
        evictable = core.radix.evictable_pages() if core.radix is not None else 0
        return sched.over_high_water(used, evictable, core.cfg)
