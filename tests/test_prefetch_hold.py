"""The return prefetch's hold (issue 60): a session brought back from the KV tier for its due
tools is held at a protection level of its own (kv/memory.py: HELD) -- another request's
admission and other prefetches cannot take its pages, a running request's growth can, its
next request uses them, and closing the session or the hold's end lets them go. Oracle: every
output equals naive greedy decoding on the tiny Qwen2 (random weights: a wrong page shows);
the pool, tree and tier invariants hold after every step (drain checks them). No timing: the
core runs on a clock the test moves."""

from __future__ import annotations

import random

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.kv.eviction import LRUPolicy
from agentrt.kv.memory import HELD, QUEUED, UNPINNED, held
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import assert_quiescent, drain, submit

V = 301
SP = SamplingParams(max_tokens=4)


class _Clock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _held_session(**cfg):
    """A core whose session `a` waited on a tool, was cut to the tier by a transient request,
    and was brought back by the return prefetch once due (held now). Returns (model, core,
    clock, a, a's history, rng, pages a held before the prefetch)."""
    model, clock = tiny_model("qwen2"), _Clock()
    cfg = EngineConfig(**{**dict(kv_cache_tokens=24 * 16, page_size=16, response_cache_size=0,
                                 enable_speculation=False, debug_invariants=True, kv_tier_bytes=1 << 30), **cfg})
    core = EngineCore(model, cfg, policy=LRUPolicy(), clock=clock)
    rng = random.Random(5)
    a = core.open_session(core.pool.acquire("session", 0), tag="a")
    hist = [rng.randrange(V) for _ in range(120)]
    hist += submit_and_drain(core, hist, a)
    core.retention.durations.prior_s = 10.0  # (no observation yet: due after half the prior)
    core.expect_tools(a, ("search",))
    a.pin_until = a.tools_at  # (its pin expired at once: pressure may cut it)
    submit_and_drain(core, [rng.randrange(V) for _ in range(300)])
    before = len(a.seq.pages)
    assert len(a.seq.tokens) < len(hist) - 16 and core.stats().demoted_pages > 0
    clock.t = 6.0
    core.idle()
    return model, core, clock, a, hist, rng, before


def submit_and_drain(core, prompt, session=None) -> list[int]:
    r = submit(core, prompt, SP, session=session)
    drain(core)
    assert r.output == generate(core.model, list(prompt), SP)
    return r.output


def _idle_ids(core, level: int) -> set[int]:
    return {id(s) for s in core.kv.mem.idle_sessions(level)}


def test_a_held_session_survives_another_admission_and_its_next_turn_uses_it():
    model, core, clock, a, hist, rng, before = _held_session()
    got = len(a.seq.pages) - before
    assert got > 0 and held(a, clock.now())
    # held: no prefetch may take its pages, an admission or growth only after everything else
    assert id(a) in _idle_ids(core, HELD) and id(a) not in _idle_ids(core, QUEUED) | _idle_ids(core, UNPINNED)
    # another session's history, cut to the tier meanwhile, comes back at its admission: the
    # room comes from the tree's unheld leaves, not from a
    b = core.open_session(core.pool.acquire("session", 1), tag="b")
    hb = [rng.randrange(V) for _ in range(100)]
    hb += submit_and_drain(core, hb, b)
    submit_and_drain(core, [rng.randrange(V) for _ in range(220)])  # (cuts b, not the held a)
    pages, evicted = list(a.seq.pages), core.stats().evicted_pages
    assert len(b.seq.tokens) < len(hb) - 16
    submit_and_drain(core, hb + [rng.randrange(V) for _ in range(8)], b)
    assert core.stats().evicted_pages > evicted  # (under pressure: the admission made room)
    assert a.seq.pages == pages  # (held: none of a's pages went)
    clock.t = 7.0
    submit_and_drain(core, hist + [rng.randrange(V) for _ in range(8)], a)
    st = core.stats()
    assert st.return_prefetched_pages == got == st.prefetched_pages
    assert st.return_prefetch_used_pages == got and st.prefetch_used_fraction == 1.0 and st.prefetch_saved_s > 0
    assert not held(a, clock.now())  # (its request arrived: the hold is over)


def test_a_running_requests_growth_may_take_held_pages_without_preempting():
    model, core, clock, a, hist, rng, before = _held_session()
    got = len(a.seq.pages) - before
    assert got > 0 and held(a, clock.now())
    # a request needing nearly the whole pool: admitted (the footprint counts running requests),
    # its prefill grows into a's held pages rather than preempt or fail
    submit_and_drain(core, [rng.randrange(V) for _ in range(330)])
    st = core.stats()
    assert st.preemptions == 0 and len(a.seq.pages) < before + got
    clock.t = 7.0
    submit_and_drain(core, hist + [rng.randrange(V) for _ in range(8)], a)
    st = core.stats()
    assert st.return_prefetched_pages == got and st.return_prefetch_used_pages < got


def test_closing_a_held_session_frees_its_pages_and_the_hold_ends_with_its_pin():
    model, core, clock, a, hist, rng, before = _held_session()
    assert held(a, clock.now())
    a2_pages = len(a.seq.pages)
    core.close_session(a)  # (its full pages live on in the tree: evictable by anyone)
    core.check_invariants()
    submit_and_drain(core, [rng.randrange(V) for _ in range(330)])
    assert core.stats().preemptions == 0 and a2_pages > 0
    assert_quiescent(core)

    model, core, clock, a, hist, rng, before = _held_session()
    assert held(a, clock.now()) and id(a) not in _idle_ids(core, UNPINNED)
    clock.t = a.pin_until + 0.01  # (the hold ran out: its tool is in its far tail)
    assert not held(a, clock.now()) and id(a) in _idle_ids(core, UNPINNED)
    submit_and_drain(core, hist + [rng.randrange(V) for _ in range(8)], a)


def test_return_prefetch_off_leaves_the_history_to_the_admission():
    model, core, clock, a, hist, rng, before = _held_session(enable_return_prefetch=False)
    assert len(a.seq.pages) == before and not held(a, clock.now())
    assert core.idle() is None  # (no wait to wake for)
    clock.t = 7.0
    submit_and_drain(core, hist + [rng.randrange(V) for _ in range(8)], a)
    st = core.stats()
    assert st.prefetched_pages == 0 and st.promoted_pages > 0
