"""Preemption and shared-prefill followers: the scheduler's decisions over the running requests
when memory runs short, on top of what the KV room frees (kv/memory.py::MemoryManager: `reclaim`
makes room among cached leaves and idle sessions, and only frees pages).

- `reserve`: make a request's positions writable; when making room is not enough and the plan
  allows, the youngest running request (then the request itself) is preempted.
- `preempt`: drop a running request's KV and queue it again at the head of the waiting queue.
- `drop_links` / `resolve_followers`: a request that follows a leader's shared prefill
  (scheduling/prefix.py::group_new_requests) aliases the leader's block once it is computed.
All of it runs in the engine's step thread, over the scheduler's queues and the KV room's memory
manager, both given explicitly."""

from __future__ import annotations

from agentrt.errors import OutOfKVMemory
from agentrt.kv.memory import MemoryManager
from agentrt.kv.radix import RadixCache
from agentrt.records.request import Request, State
from agentrt.scheduling.queues import Queues


def reserve(mem: MemoryManager, queues: Queues, r: Request, end: int, plan: dict, may_preempt: bool,
            failed: list) -> bool:
    """Make r's positions up to `end` writable. With may_preempt, younger running requests
    (then r itself) are preempted until it fits; preempted requests leave `plan`, and those
    that must fail instead go to `failed` as (request, error) for the caller to finish."""
    running = queues.running
    while True:
        if mem.reclaim(mem.kvm.write_cost(r.seq, end)):
            mem.kvm.prepare_write(r.seq, end)
            return True
        if not may_preempt:
            return False
        victim = max(running, key=lambda x: x.admitted_at)
        err = preempt(mem, queues, victim, alone=len(running) == 1)
        if err is not None:
            failed.append((victim, err))
        plan.pop(victim, None)
        if victim is r:
            return False


def preempt(mem: MemoryManager, queues: Queues, r: Request, alone: bool = False) -> OutOfKVMemory | None:
    """Drop r's KV and queue it again: it waits for room (admitted again only alone,
    admission.Footprint, so it is never the youngest again while others run, and preemption
    cannot loop). `alone`: r was the only running request and still could not get its pages;
    the first time, its own KV may be what pinned the rest (a cached leaf it shares a page
    with cannot be evicted, and is split at its match when it is admitted again), so it goes
    back to wait; preempted alone again after that, it cannot fit even alone: it leaves the
    running list with its KV freed, and the returned OutOfKVMemory is for the caller to
    finish it with."""
    r.preemptions += 1  # (its pages were no idle session's: the cached owners stay true)
    mem.counters.preemptions += 1
    queues.running.remove(r)
    drop_links(mem.radix, queues.running, r)
    mem.kvm.release(r.seq)
    if alone and r.preemptions > 1:
        alloc = mem.alloc
        return OutOfKVMemory(
            f"request {r.rid} ({len(r.target)} tokens) cannot fit in the KV pool even alone "
            f"({mem.cfg.kv_cache_tokens} tokens; {alloc.num_free} of {alloc.num_pages} pages free "
            "once its own were dropped, after evicting every cached page it could); raise "
            "EngineConfig.kv_cache_tokens, lower max_tokens, or close idle sessions")
    r.state, r.attached = State.WAITING, False
    queues.waiting.appendleft(r)
    return None


def drop_links(radix: RadixCache | None, running: list[Request], r: Request) -> None:
    """Unlock r's radix path and cut leader/follower links that involve it."""
    if r.lock_node is not None:
        assert radix is not None  # (a request locks a node only in a radix cache)
        radix.unlock(r.lock_node)
        r.lock_node = None
    r.leader = None
    for f in running:
        if f.leader is r:
            f.leader = None


def resolve_followers(mem: MemoryManager, running: list[Request]) -> None:
    """A follower whose leader now holds the shared block aliases it (metadata only)."""
    kvm = mem.kvm
    for f in running:
        lead = f.leader
        if lead is None or lead.seq.num_cached < f.share_end:
            continue
        end = kvm.valid_point(lead.seq.pages, f.share_end)  # (kv/window.py)
        gained = end - f.seq.num_cached
        f.leader = None
        if gained <= 0:
            continue
        if f.lock_node is not None:
            mem.radix.unlock(f.lock_node)
            f.lock_node = None
        kvm.release(f.seq)
        kvm.alias(f.seq, f.target[:end], lead.seq.pages)
        mem.counters.grouped_tokens += gained
        if not f.preemptions:  # served from KV computed once: cached, for usage and hit rate
            f.cached_tokens += gained
            mem.counters.prompt_cached += gained
