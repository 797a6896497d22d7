"""Helpers for driving EngineCore synchronously in tests."""

from __future__ import annotations

import itertools

from agentrt.engine.core import EngineCore


def submit(core: EngineCore, prompt, params, session=None, **kw):
    seq_id = None if session is not None else core.pool.acquire("transient", 0)
    return core.add_request(list(prompt), params, lambda ev: None, seq_id=seq_id,
                            session=session, **kw)


def drain(core: EngineCore, max_steps: int = 100_000) -> int:
    """Step until idle, checking every invariant after every step."""
    steps = 0
    while core.has_work():
        core.step()
        core.check_invariants()
        steps += 1
        if steps > max_steps:
            raise AssertionError("engine made no progress")
    assert_quiescent(core)
    return steps


def assert_quiescent(core: EngineCore) -> None:
    """Idle engine: pages in use == pages held by live sessions + the radix cache."""
    held = {p for s in core.sessions.values() for p in s.seq.pages}
    if core.radix is not None:
        held |= set(core.radix.all_pages())
    used = core.alloc.num_used
    assert used == len(held), (used, len(held))
    assert core.pool.num_free("transient") == core.cfg.max_transient_seqs
    live = list(itertools.chain(core.waiting, core.running))
    assert not live
