"""Memory pressure inside a step. Order of remedies, cheapest first: free pages -> take
resident radix leaves out of the pool (demoted to the KV tier, or dropped) -> preempt the
youngest running request (its KV is dropped and recomputed when it is re-admitted: that
decision is the scheduler's, scheduling/preemption.py; this room only frees pages).

Sessions and the tree compete in one ranking (partial detach). An idle session's history is in
the radix tree (inserted when each turn ends), so its newest turn is a leaf of the tree whose
pages the session also holds. Such a leaf is a candidate like any cache leaf: taking it cuts
the session back to the leaf's start (its tail first, newest turn first) while its head -- the
system prompt and tools other agents share, an interior node -- stays resident. The eviction
policy (kv/eviction.py) orders all candidates together, in passes by protection level:
UNPINNED candidates first (all a prefetch may take); a session pinned by tool-aware retention
(kv/retention.py) only in a second pass (PINNED); one with a request queued (about to run:
cutting it now would only move its pages out and back) in a third (QUEUED); and a session
brought back by a return prefetch and held for its due tools (`held`) only in a fourth (HELD),
after everything else: never by another prefetch, and by a request's admission or growth only
when nothing else is left (an admission that could not promote its history would recompute
it into the same pages: admission does not wait for a hold, scheduling/admission.py); the
hold ends with its pin or its request. None of them is kept instead of preempting a running
request. Running requests' and busy sessions' pages are never
candidates. The next turn of a cut session gets its tail back from the tree, the tier (a copy)
or, last, by recompute."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager
from typing import Protocol

# protection levels (passes of reclaim), each including those below it: what a prefetch may
# take (UNPINNED), then the pinned, the queued, and last the held (an admission's or growth's)
UNPINNED, PINNED, QUEUED, HELD = 0, 1, 2, 3


def held(s, now: float) -> bool:
    """Session s was brought back by a return prefetch and its hold (its pin) still runs."""
    return bool(s.prefetch_pages) and now < s.pin_until


class SchedulingFacts(Protocol):
    """What making room asks of whoever owns the request queues (scheduling/scheduler.py), as
    plain facts: the memory manager holds none of the scheduler's structures."""

    def queued_sessions(self) -> set[int]:
        """ids of the sessions whose request is queued and not attached yet."""
        ...

    def kept_prefixes(self) -> Mapping[str, int] | None:
        """agent -> tokens of its static prefix, evicted last (the scheduling policy's keep)."""
        ...

    def evicted(self, leaf) -> None:
        """A leaf taken out of the pool (for the decision trace)."""
        ...


class NoFacts:
    """Nothing queued, nothing kept, no one told: a memory manager no scheduler consults."""

    def queued_sessions(self) -> set[int]:
        return set()

    def kept_prefixes(self) -> Mapping[str, int] | None:
        return None

    def evicted(self, leaf) -> None:
        return None


class MemoryManager:
    """Explicit collaborators, one direction: the allocator, KV manager, radix tree, eviction
    policy, counters, the engine's sessions and clock; the scheduler's facts (`consult`). It frees
    memory and returns what must fail; the scheduler and the core finish those requests."""

    def __init__(self, cfg, alloc, kvm, radix, policy, counters, sessions: dict, clock):
        self.cfg, self.alloc, self.kvm, self.radix, self.clock = cfg, alloc, kvm, radix, clock
        self.policy, self.counters, self.sessions = policy, counters, sessions
        self.facts: SchedulingFacts = NoFacts()
        # within one planning pass (None: outside one) the index is refreshed once and each
        # level's eligible session ids are found once: who is idle does not change inside a pass
        # (a preempted request's session had no pages left to count), and what idle sessions
        # lose goes through _forget_pages
        self._levels: dict[int, set] | None = None
        self._fresh = False  # the index was refreshed in this pass
        # within a pass: (pages that cannot be evicted, alloc.allocated) when last counted exactly
        self._pinned_at: tuple[int, int] | None = None
        # idle sessions' pages: page -> [(session, index)], and id(session) -> (session, pages)
        self._index: dict[int, list] = {}
        self._held: dict[int, tuple] = {}

    def consult(self, facts: SchedulingFacts) -> None:
        """From now on, ask `facts` what is queued and kept (the scheduler, once, at its start)."""
        self.facts = facts

    @contextmanager
    def planning(self):
        """One Scheduler.plan pass (see _levels)."""
        self._levels, self._fresh, self._pinned_at = {}, False, None
        try:
            yield
        finally:
            self._levels, self._fresh, self._pinned_at = None, False, None

    def _forget_pages(self, s, i: int) -> None:
        """Session s is about to lose its pages from index i: keep the owners index exact."""
        held = self._held.get(id(s))
        if held is None:
            return
        for j, p in enumerate(held[1][i:], start=i):
            self._index[p].remove((s, j))
        self._held[id(s)] = (s, held[1][:i])

    def _refresh(self) -> None:
        """Bring the page -> idle holders index up to date: sessions that became idle, stopped
        being idle or whose pages changed since the last refresh (compared as tuples, in C)."""
        now = {id(s): s for s in self.idle_sessions(HELD)}
        for key in [k for k in self._held if k not in now]:
            self._drop_holder(key)
        for key, s in now.items():
            pages = tuple(s.seq.pages)
            held = self._held.get(key)
            if held is not None and held[0] is s and held[1] == pages:
                continue
            if held is not None:
                self._drop_holder(key)
            for j, p in enumerate(pages):
                self._index.setdefault(p, []).append((s, j))
            self._held[key] = (s, pages)

    def _drop_holder(self, key: int) -> None:
        s, pages = self._held.pop(key)
        for j, p in enumerate(pages):
            holders = self._index[p]
            holders.remove((s, j))
            if not holders:
                del self._index[p]

    def _owners_of(self, level: int) -> dict[int, list] | _Filtered:
        """page -> [(session, page index)] over the sessions of idle_sessions(level): one index
        over every idle session (HELD, the widest), kept across steps and updated by what
        changed, seen through the level's sessions (a walk of every idle session's pages on each
        reserve was most of a step's time at hundreds of agents)."""
        if not self._fresh:  # (once per pass, on first use; outside a pass on every call)
            self._refresh()
            self._fresh = self._levels is not None
        if level == HELD:
            return self._index
        ids = None if self._levels is None else self._levels.get(level)
        if ids is None:
            ids = {id(s) for s in self.idle_sessions(level)}
            if self._levels is not None:
                self._levels[level] = ids
        return _Filtered(self._index, ids)

    def reclaim(self, n_pages: int, allow=None, *, level: int = HELD, trim: bool = True) -> bool:
        """Try to have n_pages free, without touching running requests. Candidates go in passes
        by protection level, up to `level`: UNPINNED (a prefetch), PINNED, QUEUED, HELD (the
        default: an admission, a running request's growth). `allow(leaf)` limits the candidates
        (prefetch: only leaves needed later); `trim` lets the last resort drop what the tree does
        not hold of idle sessions (up to `level` too)."""
        alloc = self.alloc
        if alloc.num_free >= n_pages:
            return True
        if self.radix is None:
            return self._drop_sessions(n_pages, level)
        for lv in range(level + 1):
            while alloc.num_free < n_pages:
                cands = self.candidates(lv, allow)
                if not cands or not self._take(cands, n_pages):
                    break
        if alloc.num_free < n_pages and trim:
            self._trim_partial_pages(n_pages, level)
        return alloc.num_free >= n_pages

    def idle_sessions(self, level: int = HELD) -> list:
        """Sessions holding KV that no admitted request uses: idle, or busy with a request still
        queued unattached (it holds nothing it needs yet; admission finds its KV again). By
        `level`, what may give up pages: UNPINNED neither pinned by a TTL, nor queued, nor held;
        PINNED also the pinned; QUEUED also those with a request queued; HELD also those a return
        prefetch brought back and holds (`held`)."""
        queued = self.facts.queued_sessions()
        now = self.clock.now()
        return [s for s in self.sessions.values() if s.seq.pages and (not s.busy or id(s) in queued)
                and (level >= HELD or not held(s, now))
                and (level >= QUEUED or id(s) not in queued)
                and (level >= PINNED or s.pin_until <= now)]

    def candidates(self, level: int, allow) -> dict:
        """Resident leaves whose pages would all be freed by cutting idle sessions (of
        idle_sessions(level)) back: {leaf: [(session, page index to cut at), ...]}."""
        owners = self._owners_of(level)
        cands = {}
        for leaf in self.radix.resident_leaves():
            if allow is not None and not allow(leaf):
                continue
            cuts: dict = {}  # session -> the page index it is cut at
            ok = True
            for p in leaf.pages:
                held = owners.get(p, ())
                if self.alloc.refcount(p) - 1 != len(held):
                    ok = False  # a running request (or a session not cut now) uses it
                    break
                for s, i in held:
                    cuts[s] = min(i, cuts.get(s, i))
            if ok:
                cands[leaf] = list(cuts.items())
        return cands

    def _take(self, cands: dict, n_pages: int) -> bool:
        """Take candidates in policy order until n_pages are free; False if none could go."""
        took = False
        for leaf in self._victim_order(list(cands)):
            for s, i in cands[leaf]:
                if len(s.seq.pages) > i:
                    self._forget_pages(s, i)
                    self.kvm.truncate(s.seq, min(len(s.seq.tokens), i * self.cfg.page_size))
                    self.counters.detached_sessions += 1
            if not leaf.resident or any(self.alloc.refcount(p) != 1 for p in leaf.pages):
                continue
            self.facts.evicted(leaf)
            self.counters.evicted_pages += self.radix.discard(leaf)
            took = True
            if self.alloc.num_free >= n_pages:
                break
        return took

    def _victim_order(self, leaves: list) -> list:
        """The eviction policy's order, with the static prefixes of the agents the scheduling
        policy keeps (scheduling/policies.py: Decision.keep) after every other leaf. Only nodes that
        begin inside an agent's prefix are kept: its requests' own tails are not."""
        order = self.policy.victim_order(leaves)
        keep = self.facts.kept_prefixes()
        if not keep:
            return order
        first: list = []
        kept: list = []
        for x in order:
            (kept if x.tag in keep and x.start < keep[x.tag] else first).append(x)
        return first + kept

    def _trim_partial_pages(self, n_pages: int, level: int) -> None:
        """Last resort before preemption: idle sessions (up to `level`) give up what the tree
        does not hold (a partially filled last page, pages of a turn that never entered the tree)."""
        for s in self._order_sessions(self.idle_sessions(level)):
            if s.seq.tokens:
                self.radix.insert(s.seq.tokens, s.seq.pages, s.space, s.tag)
            self._forget_pages(s, 0)
            self.kvm.release(s.seq)
            self.counters.detached_sessions += 1
            self.counters.evicted_pages += self.radix.evict(n_pages - self.alloc.num_free)
            if self.alloc.num_free >= n_pages:
                return

    def _drop_sessions(self, n_pages: int, level: int) -> bool:
        """Without a radix tree an idle session's KV cannot be kept anywhere: whole sessions
        (up to `level`) are dropped, in the policy's order (their next turn recomputes)."""
        for s in self._order_sessions(self.idle_sessions(level)):
            if self.alloc.num_free >= n_pages:
                break
            self._forget_pages(s, 0)
            self.kvm.release(s.seq)
            self.counters.detached_sessions += 1
        return self.alloc.num_free >= n_pages

    def _order_sessions(self, sessions: list) -> list:
        """The policy's session order (least recently used first by default: kv/eviction.py)."""
        return self.policy.order_sessions(sessions)

    def evictable_pages(self) -> int:
        """Pages reclaim() could free now: tree pages held by nobody else but idle sessions."""
        if self.radix is None:
            return 0
        idle = self._owners_of(HELD)  # page -> the idle sessions holding it
        return sum(1 for n in self.radix.nodes() if n.lock_ref == 0
                   for p in n.pages if self.alloc.refcount(p) == 1 + len(idle.get(p, ())))

    def over_high_water(self) -> bool:
        """Occupancy net of evictable cache above the high-water mark (prefill chunks wait).
        Inside a planning pass the pages that cannot be evicted grow only by what is allocated
        (making room, copy-on-write's old page, preemption and trimming only lower them; who is
        idle and what is locked change at admission, before the pass), so the count taken once
        plus the pages allocated since bounds it from above: while that bound is under the mark,
        so is the exact count, and the tree is walked again only when it is not."""
        alloc = self.alloc
        used = alloc.num_used
        if not over_high_water(used, 0, self.cfg):
            return False  # the tree walk below is only needed near the mark
        if self._pinned_at is not None and self._levels is not None:
            pinned, at = self._pinned_at
            if not over_high_water(pinned + alloc.allocated - at, 0, self.cfg):
                if self.cfg.debug_invariants and over_high_water(used, self.evictable_pages(), self.cfg):
                    raise AssertionError("the pinned-page bound fell below the exact count")
                return False
        pinned = used - self.evictable_pages()
        if self._levels is not None:
            self._pinned_at = (pinned, alloc.allocated)
        return over_high_water(pinned, 0, self.cfg)


def over_high_water(used_pages: int, evictable_pages: int, cfg) -> bool:
    """Occupancy net of evictable cache above the high-water mark: prefill chunks wait."""
    return (used_pages - evictable_pages) > cfg.high_water * cfg.num_pages


class _Filtered:
    """A page -> holders map seen through a set of eligible sessions (MemoryManager._owners_of)."""

    def __init__(self, owners: dict, ids: set):
        self.owners, self.ids = owners, ids

    def get(self, page: int, default=()):
        held = self.owners.get(page)
        return default if held is None else [h for h in held if id(h[0]) in self.ids]
