"""The engine's state changes as structlog events, one per change that matters.

    request.admitted   a request starts running (its cached / promoted prompt tokens, queue wait)
    request.preempted  its KV was dropped for memory; it waits to be recomputed
    request.failed     it ended with an error (warning level)
    kv.evicted         a step took KV out of the pool: pages evicted (demoted to the tier or dropped)
                       and the sessions cut back for it
    kv.promoted        pages copied back from the KV tier (at admission or by prefetch)

Every event names what it concerns: `request` (the request id), `agent` (its tag: the agent or
stage), `session` (the session id) and `task`. The runtime adds `agent.passivated` and
`agent.activated` (runtime/leases.py), inside the actor's bound `actor` and `task`.

Cost when off. The events go to the structlog logger "agentrt.events"; whether they are made at
all is the standard library's level of the logger of that name (structlog's `filter_by_level`
convention): debug events only when it is enabled for DEBUG, e.g.
`logging.getLogger("agentrt.events").setLevel(logging.DEBUG)`. The level is read once per step
(a cached lookup in `logging`); while it is off the step pays that and a few attribute checks,
and no event dict, string or snapshot is built. Failures are checked at WARNING (on by default).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import structlog

LOGGER = "agentrt.events"


class Mark(NamedTuple):
    """Counters before a step, to name what it changed."""

    evicted: int
    demoted: int
    dropped: int
    promoted: int
    prefetched: int
    pages: dict  # session id -> pages held, of the idle sessions


class EngineEvents:
    """Makes the events of one engine core; `on` is refreshed once per step (`before_step`)."""

    def __init__(self, counters: Any, kv: Any) -> None:
        self.counters, self.kv = counters, kv
        self.log = structlog.get_logger(LOGGER)
        self.level = logging.getLogger(LOGGER)
        self.on = False

    def before_step(self) -> Mark | None:
        """Refresh `on`; when on, what the step's after_step compares with."""
        self.on = self.level.isEnabledFor(logging.DEBUG)
        if not self.on:
            return None
        c, radix = self.counters, self.kv.radix
        pages = {sid: len(s.seq.pages) for sid, s in self.kv.sessions.items() if not s.busy}
        return Mark(c.evicted_pages, radix.demoted_pages if radix else 0, radix.dropped_pages if radix else 0,
                    c.promoted_pages, c.prefetched_pages, pages)

    @contextlib.contextmanager
    def around(self) -> Iterator[None]:
        """A step (or idle work): the events of what it changed, when on."""
        mark = self.before_step()
        try:
            yield
        finally:
            if mark is not None:
                self.after_step(mark)

    def after_step(self, mark: Mark) -> None:
        c, radix = self.counters, self.kv.radix
        evicted = c.evicted_pages - mark.evicted
        cut = [(sid, n, len(s.seq.pages)) for sid, n in mark.pages.items()
               if (s := self.kv.sessions.get(sid)) is not None and len(s.seq.pages) < n]
        if evicted or cut:
            self.log.debug("kv.evicted", pages=evicted,
                           demoted=(radix.demoted_pages - mark.demoted) if radix else 0,
                           dropped=(radix.dropped_pages - mark.dropped) if radix else 0,
                           sessions=[{"session": sid, "agent": self.kv.sessions[sid].tag, "pages_before": n,
                                      "pages_after": m} for sid, n, m in cut])
        if c.promoted_pages > mark.promoted:
            self.log.debug("kv.promoted", pages=c.promoted_pages - mark.promoted,
                           prefetched=c.prefetched_pages - mark.prefetched)

    # ---- per request (each called only while `on`, but failed) ------------------------------
    def admitted(self, r: Any) -> None:
        self.log.debug("request.admitted", **ids(r), prompt_tokens=len(r.prompt), cached_tokens=r.cached_tokens,
                       promoted_tokens=r.promoted, queue_wait_s=r.admitted_s - r.submitted_s,
                       readmission=r.preemptions > 0)

    def preempted(self, r: Any) -> None:
        self.log.debug("request.preempted", **ids(r), preemptions=r.preemptions, tokens=r.target_len)

    def failed(self, r: Any, error: BaseException | None) -> None:
        if self.level.isEnabledFor(logging.WARNING):
            self.log.warning("request.failed", **ids(r), error=repr(error) if error is not None else None)


def ids(r: Any) -> dict:
    """The ids an event about request `r` is bound to."""
    return {"request": r.rid, "agent": r.tag, "session": r.session.sid if r.session is not None else None,
            "task": r.task}


def debug(event: str, **ids: Any) -> None:
    """One debug event off the step loop (the runtime's), under the same gate."""
    if logging.getLogger(LOGGER).isEnabledFor(logging.DEBUG):
        structlog.get_logger(LOGGER).debug(event, **ids)
