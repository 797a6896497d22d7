"""One page, one owner: a property test of the KV room (kv/room.py) as the engine core drives it.

Hypothesis plays sessions' and transient requests' turns over the real classes -- admission's
prefix reuse and prefix grouping (scheduling/prefix.py: match, alias, lock_match's split), the
memory manager (kv/memory.py: partial detach, demotion, preemption), the hierarchy (kv/hierarchy.py:
promotion from the tier), branching (fork, rollback), the radix tree's own eviction, inserts with
tags -- and after every step checks:

* every page's refcount equals its holders: radix nodes, sessions, running transient requests
  (`KVRoom.check_invariants`, which also runs `RadixCache.check_invariants`: no page listed by
  two nodes);
* every node's lock count equals the running requests whose locked path passes through it;
* a page means one run of tokens: every sequence that lists a page the tree holds lists it at the
  node's position, over the node's tokens and everything before them.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.config import EngineConfig
from agentrt.engine.stats import Counters
from agentrt.kv.branching import Branching
from agentrt.kv.hierarchy import Hierarchy
from agentrt.kv.kv_manager import Sequence
from agentrt.kv.pages import PageAllocator
from agentrt.kv.radix import RadixCache
from agentrt.kv.registry import make_policy
from agentrt.kv.room import KVRoom
from agentrt.kv.store import KVStore
from agentrt.kv.tier import HostTier
from agentrt.model.config import ModelConfig
from agentrt.records.request import Request
from agentrt.sampling import SamplingParams
from agentrt.scheduling.preemption import drop_links, reserve, resolve_followers
from agentrt.scheduling.prefix import attach_prefix, group_new_requests
from agentrt.scheduling.queues import Queues

PS, PAGES, TIER_PAGES, SESSIONS, TRANSIENT = 4, 16, 6, 4, 3
CFG = ModelConfig(arch="llama", vocab_size=50, hidden_size=8, intermediate_size=16, num_layers=1,
                  num_heads=2, num_kv_heads=1, head_dim=4)
BASES = ([7, 7, 7, 7, 1, 2, 3, 4], [7, 7, 7, 7, 1, 2, 9, 9], [8] * 8)  # shared system prompts
TAGS = ("a0", "a1", "a2")


class _Clock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _tier(store) -> HostTier:
    tier = HostTier(store, 1)
    tier.budget = TIER_PAGES * tier.page_bytes
    tier.copy_s_per_page = 0.0  # a copy always beats recomputing: every promotion is taken
    return tier


class Room:
    """The KV room and the core's moves over it (admit, compute, finish, preempt, close)."""

    def __init__(self, policy: str):
        self.cfg = EngineConfig(kv_cache_tokens=PAGES * PS, page_size=PS, max_session_seqs=SESSIONS)
        self.queues, self.clock, self.rids = Queues(), _Clock(), itertools.count(1)
        store = KVStore.allocate(CFG, PAGES, PS)
        self.kv = KVRoom(self.cfg, store, make_policy(policy), Counters(), self.clock, make_tier=_tier)
        self.kv.mem.consult(self)  # (what is queued: the scheduler's facts, as the core's scheduler tells them)
        self.hier = Hierarchy(self.kv)
        self.branching = Branching(self.kv, self.hier)
        self.free_sids = list(range(TRANSIENT, TRANSIENT + SESSIONS))
        self.transient = itertools.count()
        for i in range(2):  # two agents that have had a turn each on their own system prompt
            self.open(TAGS[i], salt=None)
        self.admit([(s, list(BASES[i])) for i, s in enumerate(self.kv.sessions.values())])
        while self.queues.running:
            self.finish(0)

    def open(self, tag, salt):
        if self.free_sids:
            return self.kv.open_session(self.free_sids.pop(), tag, salt)

    # ---- the scheduler's facts (kv/memory.py::SchedulingFacts) -------------------------------
    def queued_sessions(self) -> set[int]:
        return self.queues.queued_sessions()

    def kept_prefixes(self) -> None:
        return None

    def evicted(self, leaf) -> None:
        return None

    def idle(self) -> list:
        return [s for s in self.kv.sessions.values() if not s.busy]

    # ---- a turn: admission (prefix reuse, grouping), compute, finish ------------------------
    def admit(self, specs: list) -> None:
        reqs = []
        for sess, prompt in specs:
            seq = sess.seq if sess is not None else Sequence(next(self.transient) % TRANSIENT)
            r = Request(next(self.rids), prompt, SamplingParams(), seq, lambda e: None, session=sess,
                        cache_salt=sess.cache_salt if sess is not None else None,
                        tag=sess.tag if sess is not None else "t")
            if sess is not None:
                sess.busy = True
            r.admitted_at = r.rid
            self.queues.running.append(r)
            attach_prefix(r, self.kv.kvm, self.kv.radix, True,
                          promote=lambda t, s=r.cache_salt: self.hier.promote_prefix(t, s))
            r.attached = True
            reqs.append(r)
        group_new_requests(reqs, PS)
        for r in sorted(reqs, key=lambda x: x.leader is not None):  # leaders first
            if r in self.queues.running:
                resolve_followers(self.kv.mem, self.queues.running)
                self.compute(r, len(r.prompt))

    def compute(self, r: Request, end: int) -> None:
        """Write r's KV up to `end` (preempting the youngest when memory is short, as the core does)."""
        if r.leader is not None:
            return  # (waits for its leader's block: a later resolve_followers aliases it)
        failed: list = []
        if reserve(self.kv.mem, self.queues, r, end, {}, True, failed):
            r.seq.tokens = list(r.target[:end])
            r.computed_prompt = end
        for f, _ in failed:  # (could not fit even alone: out of the running list, its KV freed)
            if f.session is not None:
                f.session.busy = False
        self._drop_preempted()

    def _drop_preempted(self) -> None:
        """Preempted requests (queued again by the memory manager) are given up here."""
        while self.queues.waiting:
            r = self.queues.waiting.pop()
            if r.session is not None:
                r.session.busy = False
            else:
                self.kv.kvm.release(r.seq)

    def decode(self, i: int, toks: list[int]) -> None:
        run = [r for r in self.queues.running if r.leader is None and r.seq.num_cached == r.target_len]
        if run:
            r = run[i % len(run)]
            r.output.extend(toks)
            self.compute(r, r.target_len)

    def finish(self, i: int) -> None:
        run = [r for r in self.queues.running if r.leader is None and r.seq.num_cached == r.target_len]
        if not run:
            return
        r = run[i % len(run)]
        self.queues.running.remove(r)
        drop_links(self.kv.radix, self.queues.running, r)
        self.kv.insert_prefix(r.seq.tokens, r.seq.pages, r.cache_salt, r.tag)
        if r.session is not None:
            r.session.busy, r.session.history = False, list(r.seq.tokens)
            r.session.last_used = r.rid
        else:
            self.kv.kvm.release(r.seq)

    def close(self, sess) -> None:  # (EngineCore.close_session on an idle session)
        sess.closed = True
        self.kv.insert_prefix(sess.seq.tokens, sess.seq.pages, sess.cache_salt, sess.tag)
        self.kv.kvm.release(sess.seq)
        self.kv.forget_session(sess)
        self.free_sids.append(sess.sid)

    # ---- the oracles ------------------------------------------------------------------------
    def check(self) -> None:
        running = self.queues.running
        self.kv.check_invariants([r.seq.pages for r in running if r.session is None])
        radix = self.kv.radix
        locks = {}
        for r in running:
            n = r.lock_node
            while n is not None:
                locks[id(n)] = locks.get(id(n), 0) + 1
                n = n.parent
        seqs = [r.seq for r in running if r.session is None] + [s.seq for s in self.kv.sessions.values()]
        where = {}  # page -> (page index, the tokens up to the page's end) for tree pages
        for n in radix.nodes():
            assert n.lock_ref == locks.get(id(n), 0), f"node at {n.start}: lock_ref {n.lock_ref}, {locks.get(id(n), 0)} users"
            if not n.pages:
                continue
            path, x = [], n
            while x is not None:
                path[:0] = x.key
                x = x.parent
            for i, p in enumerate(n.pages):
                a = n.start // PS + i
                where[p] = (a, path[:(a + 1) * PS])
        for seq in seqs:
            for j, p in enumerate(seq.pages):
                if p in where:
                    a, ctx = where[p]
                    assert j == a, f"page {p}: index {j} in a sequence, {a} in the tree"
                    upto = min(len(seq.tokens), (a + 1) * PS)
                    assert seq.tokens[:upto] == ctx[:upto], f"page {p} holds other tokens than the tree's"


def _prompt(sess, how: int, cut: int, new: list[int]) -> list[int]:
    """A session goes on from its history (whole, or cut back: an edit); or a turn begins at a
    shared system prompt."""
    if sess is not None and how == 0 and sess.history:
        keep = len(sess.history) if cut >= 4 else max(1, cut % (len(sess.history) + 1))
        return sess.history[:keep] + new
    return list(BASES[cut % len(BASES)]) + new


# turns of a few lengths (so sessions often hold as many tokens as each other), some alike
PHRASES = ([5, 6, 5, 6, 5, 6, 1, 1], [5, 6, 5, 6, 2, 2, 2, 3])
_new = st.one_of(st.integers(1, 3).flatmap(lambda n: st.lists(st.integers(1, 4), min_size=3 * n, max_size=3 * n)),
                 st.sampled_from(PHRASES).map(list))
_turn = st.tuples(st.integers(0, 7), st.integers(0, 1), st.integers(0, 15), _new)
_admit = st.tuples(st.just("admit"), st.lists(_turn, min_size=1, max_size=3), st.booleans())  # (True: one new turn)
_finish = st.tuples(st.just("finish"), st.integers(0, 9))
_op = st.one_of(  # (turns weigh most: they make the tree and the pressure the other moves act on)
    _admit, _admit, _admit, _finish, _finish, _finish,
    st.tuples(st.just("decode"), st.integers(0, 9), st.lists(st.integers(1, 4), min_size=4, max_size=4)),
    st.tuples(st.just("evict"), st.integers(1, 8)),
    st.tuples(st.just("reclaim"), st.integers(1, PAGES)),
    st.tuples(st.just("restore"), st.integers(0, 9)),
    st.tuples(st.just("fork"), st.integers(0, 9), st.sampled_from(TAGS)),
    st.tuples(st.just("rollback"), st.integers(0, 9), st.integers(0, 12)),
    st.tuples(st.just("close"), st.integers(0, 9)),
    st.tuples(st.just("open"), st.sampled_from(TAGS), st.sampled_from([None, "x"])),
)


# examples, steps and operations run, written to $AGENTRT_RADIX_COUNTS (a JSON path) when set
# (bench/reliability.py); $AGENTRT_RADIX_EXAMPLES raises the examples (default 400)
RADIX_COUNTS: Counter = Counter()
EXAMPLES = int(os.environ.get("AGENTRT_RADIX_EXAMPLES", "400"))


def teardown_module() -> None:
    if out := os.environ.get("AGENTRT_RADIX_COUNTS"):
        Path(out).write_text(json.dumps(dict(sorted(RADIX_COUNTS.items())), indent=1) + "\n")


def _pick(items: list, i: int):
    return items[i % len(items)] if items else None


def apply(room: Room, op: tuple) -> None:
    kind, kv = op[0], room.kv
    if kind == "admit":
        specs, used = [], set()
        for who, how, cut, new in op[1]:
            new = op[1][0][3] if op[2] else new
            idle = [s for s in room.idle() if id(s) not in used]
            sess = _pick(idle, who) if who < 7 else None  # (7: a transient request)
            if sess is not None:
                used.add(id(sess))
            elif sum(r.session is None for r in room.queues.running) + len(specs) >= TRANSIENT:
                continue
            specs.append((sess, _prompt(sess, how, cut, new)))
        room.admit(specs)
    elif kind == "decode":
        room.decode(op[1], op[2])
    elif kind == "finish":
        room.finish(op[1])
    elif kind == "evict":
        kv.radix.evict(op[1])
    elif kind == "reclaim":
        with kv.mem.planning():
            kv.mem.reclaim(op[1])
    elif kind == "restore" and (s := _pick(room.idle(), op[1])) is not None:
        room.hier.restore_tail(s)
    elif kind == "fork" and (s := _pick(room.idle(), op[1])) is not None and room.free_sids:
        room.branching.fork(s, room.free_sids.pop(), op[2])
    elif kind == "rollback" and (s := _pick(room.idle(), op[1])) is not None:
        room.branching.rollback(s, min(op[2], len(s.seq.tokens)))
    elif kind == "close" and (s := _pick(room.idle(), op[1])) is not None:
        room.close(s)
    elif kind == "open":
        room.open(op[1], op[2])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["lru", "agent_aware"]), ops=st.lists(_op, min_size=8, max_size=60))
def test_every_page_has_one_node_and_refcounts_equal_holders(policy, ops):
    room = Room(policy)
    room.check()
    RADIX_COUNTS["examples"] += 1
    for op in ops:
        room.clock.t += 1.0
        apply(room, op)
        room.check()
        RADIX_COUNTS["steps"] += 1
        RADIX_COUNTS["op:" + op[0]] += 1
    RADIX_COUNTS["preemptions"] += room.kv.counters.preemptions
    RADIX_COUNTS["evicted_pages"] += room.kv.counters.evicted_pages
    for r in list(room.queues.running):  # wind down: everything finishes, every session closes
        r.leader = None
        room.compute(r, r.target_len)
    while room.queues.running:
        room.finish(0)
    for s in list(room.kv.sessions.values()):
        room.close(s)
    room.check()
    kv = room.kv
    assert all(n.lock_ref == 0 for n in kv.radix.nodes())
    assert kv.alloc.num_free + len(kv.radix.all_pages()) == PAGES


def test_check_invariants_refuses_a_page_listed_by_two_nodes():
    """Two runs of tokens on one physical page (what aliasing another history's KV once made)
    is refused, whatever their tags."""
    alloc = PageAllocator(8, PS)
    tree = RadixCache(alloc)
    pages = alloc.alloc(2)
    tree.insert(list(range(8)), pages, tag="a60")
    tree.check_invariants()
    tree.insert([9] * 4 + list(range(4, 8)), pages, tag="a61")  # other tokens, the same pages
    with pytest.raises(AssertionError, match="listed by two nodes"):
        tree.check_invariants()
