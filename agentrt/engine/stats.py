"""Engine counters and the frozen snapshot `stats()` returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    """Monotonic counters; mutated only by the step thread."""

    steps: int = 0
    step_seconds: float = 0.0  # wall time of the model steps (schedule excluded)
    prompt_submitted: int = 0  # prompt tokens of all requests
    prompt_cached: int = 0  # of those, served from KV already held at admission
    prompt_computed: int = 0  # prompt tokens actually prefilled (recompute included)
    decode_tokens: int = 0
    admissions: int = 0  # requests moved from waiting to running (a re-admission after a preemption counts)
    preemptions: int = 0
    oom_steps: int = 0  # steps the device ran out of memory in (their requests failed, steps halved)
    evicted_pages: int = 0
    detached_sessions: int = 0
    deferred_chunks: int = 0
    grouped_tokens: int = 0  # prompt tokens aliased from a group leader
    spec_proposed: int = 0
    spec_accepted: int = 0
    ff_jumps: int = 0  # grammar fast-forwards (constrain/forcing.py)
    ff_tokens: int = 0  # ids they appended (fed in chunks, not decode steps)
    ff_healed: int = 0  # model tokens they respelled with the forced text
    response_cache_hits: int = 0
    promoted_pages: int = 0  # pages copied back from the KV tier (admission and prefetch)
    prefetched_pages: int = 0  # of those, promoted ahead of a request by prefetch
    prefetch_used_pages: int = 0  # ... and used by a request before they left the pool again
    prefetch_saved_s: float = 0.0  # the copies those used pages saved the admissions (seconds)
    return_prefetched_pages: int = 0  # prefetched_pages that were return prefetches (sessions due) ...
    return_prefetch_used_pages: int = 0  # ... and of those, used
    prompt_promoted: int = 0  # prompt tokens served by pages promoted at their admission
    prompt_restored: int = 0  # prompt tokens served by KV read back from the disk tier (kv/disk.py)
    ttl_pins: int = 0  # sessions pinned while their tools ran
    ttl_hits: int = 0  # ... whose next request came before the pin expired
    ttl_expired: int = 0  # ... whose next request came after
    host_syncs: int = 0  # waits of the step's host part for the device (engine/device_tail.py)
    mask_seconds: float = 0.0  # grammar masks computed and applied on the step's critical path
    masked_rows: int = 0  # logits rows masked (one per constrained request per step)
    mask_prepare_seconds: float = 0.0  # masks filled beside the forward (constrain/step_masks.py::MaskPrefetch)


@dataclass(frozen=True)
class EngineStats:
    waiting: int
    running: int
    sessions: int
    pages_total: int
    pages_free: int
    pages_cached_only: int  # held by the radix tree alone (evictable)
    # the sliding-window layers' own pool (kv/window.py; 0 where there is one pool)
    window_pages_total: int
    window_pages_free: int
    window_pages_released: int  # released early: every sequence had slid past them
    kv_occupancy: float  # (total - free) / total
    prompt_submitted: int
    prompt_cached: int
    prompt_computed: int
    hit_rate: float  # prompt_cached / prompt_submitted
    decode_tokens: int
    steps: int
    step_seconds: float  # total wall time of the steps that ran the model
    admissions: int  # waiting -> running, re-admissions included
    preemptions: int
    evicted_pages: int
    detached_sessions: int
    deferred_chunks: int
    grouped_tokens: int
    spec_proposed: int
    spec_accepted: int
    ff_jumps: int
    ff_tokens: int
    ff_healed: int
    spec_acceptance: float
    response_cache_hits: int
    tier_pages: int  # pages' worth of KV the tier holds now
    tier_bytes: int
    demoted_pages: int  # pages moved to the tier
    dropped_pages: int  # pages that left the pool (or the tier) without a copy kept
    promoted_pages: int
    prefetched_pages: int
    prefetch_used_pages: int  # prefetched pages a request used before they left the pool
    prefetch_used_fraction: float  # prefetch_used_pages / prefetched_pages
    prefetch_saved_s: float  # admission copies the used prefetches saved (seconds, estimated)
    return_prefetched_pages: int  # of prefetched_pages, return prefetches of sessions whose tools were due
    return_prefetch_used_pages: int  # ... and of those, used
    prompt_promoted: int
    prompt_restored: int  # prompt tokens served by KV read back from the disk tier
    ttl_pins: int
    ttl_hits: int
    ttl_expired: int
    tool_ttls: dict  # tool name -> the TTL (seconds) chosen last for it
    grammar_mask_s: float  # seconds spent computing and applying grammar masks (critical path)
    grammar_mask_us_per_row: float  # ... per masked logits row (a constrained request's step)
    grammar_prepare_s: float  # seconds filling masks in a worker beside the forward (off that path)
    scheduling_policy: str  # EngineConfig.scheduling_policy
    decisions: int  # scheduling decisions timed (0 under fcfs, which takes arrival order as is)
    decision_us_p50: float  # median time of one decision (view + policy), microseconds
    decision_us_p99: float
    tasks: int  # tasks the engine remembers (scheduling/tasks.py)

    @classmethod
    def snapshot(cls, c: Counters, kv, queues, scheduler, retention, tasks: int) -> "EngineStats":
        """The numbers of one moment: `c` the counters, `kv` the KV room (kv/room.py), `queues`
        the request queues, `scheduler` (its policy's decision times), `retention` (the TTLs
        chosen), `tasks` the tasks remembered."""
        a, radix, tier, loc = kv.alloc, kv.radix, kv.tier, kv.alloc.local
        times = sorted(scheduler.decision_us)
        used = c.prefetch_used_pages + (radix.prefetch_used_pages if radix else 0)
        return cls(
            waiting=len(queues.waiting), running=len(queues.running), sessions=len(kv.sessions),
            pages_total=a.num_pages, pages_free=a.num_free, pages_cached_only=kv.evictable_pages(),
            kv_occupancy=(a.num_pages - a.num_free) / a.num_pages,
            window_pages_total=loc.num_local if loc else 0, window_pages_free=loc.num_free if loc else 0,
            window_pages_released=loc.released if loc else 0,
            prompt_submitted=c.prompt_submitted, prompt_cached=c.prompt_cached,
            prompt_computed=c.prompt_computed,
            hit_rate=c.prompt_cached / c.prompt_submitted if c.prompt_submitted else 0.0,
            decode_tokens=c.decode_tokens, steps=c.steps, step_seconds=c.step_seconds,
            admissions=c.admissions, preemptions=c.preemptions,
            evicted_pages=c.evicted_pages, detached_sessions=c.detached_sessions,
            deferred_chunks=c.deferred_chunks, grouped_tokens=c.grouped_tokens,
            spec_proposed=c.spec_proposed, spec_accepted=c.spec_accepted,
            ff_jumps=c.ff_jumps, ff_tokens=c.ff_tokens, ff_healed=c.ff_healed,
            spec_acceptance=c.spec_accepted / c.spec_proposed if c.spec_proposed else 0.0,
            response_cache_hits=c.response_cache_hits,
            tier_pages=tier.used // tier.page_bytes if tier else 0, tier_bytes=tier.used if tier else 0,
            demoted_pages=radix.demoted_pages if radix else 0, dropped_pages=radix.dropped_pages if radix else 0,
            promoted_pages=c.promoted_pages, prefetched_pages=c.prefetched_pages,
            prefetch_used_pages=used, prefetch_used_fraction=used / c.prefetched_pages if c.prefetched_pages else 0.0,
            return_prefetched_pages=c.return_prefetched_pages,
            return_prefetch_used_pages=c.return_prefetch_used_pages,
            prefetch_saved_s=c.prefetch_saved_s + (radix.prefetch_used_pages * tier.copy_s_per_page if tier else 0.0),
            prompt_promoted=c.prompt_promoted, prompt_restored=c.prompt_restored, ttl_pins=c.ttl_pins, ttl_hits=c.ttl_hits,
            ttl_expired=c.ttl_expired, tool_ttls=dict(retention.chosen), grammar_mask_s=c.mask_seconds,
            grammar_prepare_s=c.mask_prepare_seconds,
            grammar_mask_us_per_row=1e6 * c.mask_seconds / c.masked_rows if c.masked_rows else 0.0,
            scheduling_policy=scheduler.cfg.scheduling_policy, decisions=len(times),
            decision_us_p50=_quantile(times, 0.5), decision_us_p99=_quantile(times, 0.99),
            tasks=tasks)


def _quantile(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0
