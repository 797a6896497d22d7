"""The engine core's invariants, checked by tests after every step (EngineConfig.debug_invariants):
pages free xor referenced with refcounts equal to their holders, pool ids free xor in use,
sessions' pages covering their tokens, and each request in exactly the queue its state names."""

from __future__ import annotations

import itertools

from agentrt.engine.request import State


def check_core(core) -> None:
    live = list(itertools.chain(core.waiting, core.running))
    holders = [r.seq.pages for r in live if r.session is None]
    holders += [s.seq.pages for s in core.sessions.values()]
    if core.radix is not None:
        core.radix.check_invariants()
        holders.append(core.radix.all_pages())
    if hasattr(core.policy, "check_invariants"):
        core.policy.check_invariants()
    core.alloc.check_invariants(holders)
    in_use = {r.seq.seq_id for r in live if r.session is None}
    core.pool.check_invariants(in_use | set(core.sessions))
    for s in core.sessions.values():
        if len(s.seq.pages) < core.kvm.pages_for(s.seq.num_cached):
            raise AssertionError("session pages do not cover its tokens")
    if len({id(r) for r in live}) != len(live):
        raise AssertionError("a request is queued twice")
    if any(r.state is not State.WAITING for r in core.waiting) or \
            any(r.state is not State.RUNNING for r in core.running):
        raise AssertionError("a request's state does not match its queue")
    if len(core.tasks.tasks) > core.tasks.max_tasks:
        raise AssertionError("the task tracker outgrew its bound")
