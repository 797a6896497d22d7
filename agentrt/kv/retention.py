"""Tool-aware retention (after Continuum, arXiv 2511.02230): keep an agent's KV while its tool
runs, for a time-to-live worth what a reload would cost.

When a turn ends in tool calls, the caller says so (`Session.expect_tools(names)`). The session
is then *pinned* until `now + TTL`: memory pressure ranks its pages after every unpinned
candidate (kv/memory.py), so they survive a tool that returns in time; at expiry they are
ordinary candidates again, and a pin never makes the engine preempt a running request.

The TTL weighs the two costs Continuum weighs:
* the tool's observed duration distribution (per tool name, the last `window` calls, learned
  from the time between `expect_tools` and the session's next request): a pin shorter than the
  tool saves nothing, so the TTL covers its q-quantile (`quantile`, with `margin`);
* the reload cost (the session's KV rebuilt by a tier copy when the tier can hold it, else by
  recompute; both measured on this machine): holding pages is worth it only up to `hold_factor`
  times that cost -- a cheap reload (the tier) earns a short pin, an expensive one a long one.
A turn calling several tools waits for the slowest: the TTL is the largest of theirs. Before a
tool has `min_samples` observations, every tool's recent durations stand in for its own (agents
with many tools call each one rarely), and before any tool has them, `prior_s`.

The same durations time the **return prefetch** (kv/hierarchy.py::prefetch_returning): a
pinned session whose KV pressure cut anyway is *due* from the moment its tools could first
return (their `early_quantile`, less a lead for the copies) -- its pages are promoted back in
the loop's slack, before the result arrives, instead of on the critical path at admission --
and held there (`hold`) for its request: no admission or other prefetch takes them back.
"""

from __future__ import annotations

import statistics
from collections import deque

from agentrt.kv.room import KVRoom


class ToolRetention:
    def __init__(self, *, max_ttl_s: float = 30.0, window: int = 32, quantile: float = 0.9,
                 margin: float = 1.25, hold_factor: float = 50.0, prior_s: float = 1.0, min_samples: int = 3,
                 early_quantile: float = 0.25):
        self.max_ttl_s, self.window, self.quantile, self.margin = max_ttl_s, window, quantile, margin
        self.early_quantile = early_quantile
        self.hold_factor, self.prior_s, self.min_samples = hold_factor, prior_s, min_samples
        self._durations: dict[str, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=4 * window)  # every tool's, the fallback of a tool seen little
        self.chosen: dict[str, float] = {}  # tool -> the TTL chosen last (reported in stats)

    def _samples(self, tool: str):
        """The tool's own durations, or, before it has min_samples, every tool's (what tools take
        in this deployment); None before that too (the prior)."""
        d = self._durations.get(tool)
        if d is not None and len(d) >= self.min_samples:
            return d
        return self._all if len(self._all) >= self.min_samples else None

    def expected(self, tool: str) -> float:
        """The duration the TTL must cover for `tool` (its q-quantile, or the prior)."""
        d = self._samples(tool)
        if d is None:
            return self.prior_s
        qs = statistics.quantiles(sorted(d), n=100, method="inclusive")
        return qs[min(98, max(0, round(self.quantile * 100) - 1))]

    def early(self, tool: str) -> float:
        """The shortest duration `tool` is likely to take (its early_quantile; half the prior
        before any observations): the earliest a return prefetch pays."""
        d = self._samples(tool)
        if d is None:
            return 0.5 * self.prior_s
        xs = sorted(d)
        return xs[min(len(xs) - 1, int(self.early_quantile * len(xs)))]

    def ttl(self, tools: tuple[str, ...], reload_s: float) -> float:
        """Seconds to pin a session whose turn called `tools` and whose KV costs reload_s to
        rebuild: the slowest tool's covered duration, capped by the hold budget."""
        cap = min(self.max_ttl_s, self.hold_factor * max(reload_s, 0.0))
        ttl = min(cap, max(self.expected(t) for t in tools) * self.margin) if tools else 0.0
        for t in tools:
            self.chosen[t] = ttl
        return ttl

    def observe(self, tools: tuple[str, ...], seconds: float) -> None:
        """The session came back `seconds` after its tools started (all of them ran that long
        at most; the slowest exactly: each is recorded, an overestimate for the faster ones)."""
        for t in tools:
            self._durations.setdefault(t, deque(maxlen=self.window)).append(max(0.0, seconds))
        self._all.append(max(0.0, seconds))


class Retention:
    """Tool-aware retention over one engine's KV space: pins sessions whose turn ended in tool
    calls, and learns the tools' durations when the sessions come back."""

    def __init__(self, kv: KVRoom, max_ttl_s: float):
        self.kv, self.durations = kv, ToolRetention(max_ttl_s=max_ttl_s)

    @property
    def chosen(self) -> dict[str, float]:
        """Tool -> the TTL chosen last for it."""
        return self.durations.chosen

    def pin(self, sess, tools: tuple[str, ...]) -> float:
        """Pin an idle session whose turn called `tools` (in the step thread); returns the TTL."""
        kv = self.kv
        if sess.busy or not kv.cfg.tool_ttl or not tools:
            return 0.0
        reload_s = kv.costs.recompute_s(len(sess.seq.tokens))
        if kv.tier is not None and kv.tier.free_pages() >= len(sess.seq.pages):  # out and back by copy
            reload_s = min(reload_s, 2 * len(sess.seq.pages) * kv.tier.copy_s_per_page)
        ttl = self.durations.ttl(tools, reload_s)
        sess.tools, sess.tools_at = tools, kv.clock.now()
        sess.pin_until = sess.tools_at + ttl
        kv.counters.ttl_pins += ttl > 0
        return ttl

    def due_at(self, sess, lead_s: float) -> float:
        """When a return prefetch of `sess` (waiting on tools) pays: its tools' earliest likely
        return, `lead_s` ahead for the copies."""
        return sess.tools_at + max(self.durations.early(t) for t in sess.tools) - lead_s

    def hold(self, sess, now: float, lead_s: float) -> None:
        """A return prefetch just brought `sess` back: pin it afresh, for its tools' covered
        duration from now (at least `lead_s`) -- the copy is paid and the tools are past their
        early return, so they are in their tail: cutting it again now would waste the copy.
        Until that pin ends the session is *held* (kv/memory.py::held, level HELD): only a
        running request's growth may take its pages; its request arriving ends the hold
        (`returned`), as closing the session does."""
        d = self.durations
        covered = max(d.expected(t) for t in sess.tools) * d.margin if sess.tools else 0.0
        sess.pin_until = max(sess.pin_until, now + max(covered, lead_s))

    def waiting(self) -> list:
        """Idle sessions waiting on tools whose KV pressure cut (history longer than what they
        hold) and not prefetched yet in this wait."""
        return [s for s in self.kv.sessions.values() if s.tools and not s.busy and s.prefetch_from < 0
                and len(s.history) > len(s.seq.tokens)]

    def returned(self, sess) -> None:
        """A request arrived on a session that was waiting on tools: learn their duration; count
        whether the pin was still on (a hit) or had expired, and how much of a return prefetch
        is still held (used) -- the copy it saved the admission."""
        if sess.prefetch_from >= 0:
            used = min(sess.prefetch_pages, max(0, len(sess.seq.pages) - sess.prefetch_from))
            self.kv.counters.prefetch_used_pages += used
            self.kv.counters.return_prefetch_used_pages += used
            tier = self.kv.tier
            self.kv.counters.prefetch_saved_s += used * (tier.copy_s_per_page if tier is not None else 0.0)
            sess.prefetch_from, sess.prefetch_pages = -1, 0
        if not sess.tools:
            return
        now = self.kv.clock.now()
        self.durations.observe(sess.tools, now - sess.tools_at)
        if sess.pin_until > sess.tools_at:
            self.kv.counters.ttl_hits += now <= sess.pin_until
            self.kv.counters.ttl_expired += now > sess.pin_until
        sess.tools, sess.pin_until = (), 0.0
