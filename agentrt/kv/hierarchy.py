"""Moving KV up the memory hierarchy: promotion at admission, prefetch while the loop has
slack, and bringing back a session tail given up under pressure.

* **Promotion** (`Hierarchy.promote_prefix`): before a request's prefix is matched, the demoted nodes that
  continue its resident match (`RadixCache.host_path`) are copied back into fresh pool pages
  when the copy is cheaper than recomputing their tokens (`HostTier.copy_s_per_page`, measured
  at start, against `CostModel`, learned from the step loop). The path is locked meanwhile, so
  making room never takes the nodes being promoted or their ancestors.
* **Return prefetch** (`Hierarchy.prefetch_returning`): a session waiting on tools whose KV
  pressure cut gets its history promoted back in the loop's slack once its tools could return
  (kv/retention.py::Retention.due_at: the tools' learned early quantile, less a lead), soonest
  first, at most once per wait, into free pages and unpinned candidates only -- the runtime
  knows who comes back when, so this is the first prefetch. The session brought back is then
  *held* (kv/memory.py: HELD, a level of its own, until its pin ends): no other prefetch may
  take its pages, and a request's admission or growth only after every other candidate. What it
  restored and a request then used is counted (`prefetch_used_pages`, `prefetch_saved_s`).
* **Prefetch** (`Hierarchy.prefetch`): between steps, the demoted pages of the agents predicted
  next -- the scheduler's hints (a declared or learned workflow's next stages,
  scheduling/tasks.py::upcoming) at distance 0, then the policy's learned chain
  (`AgentAwarePolicy.distances`, closest first), the fallback for traffic without those facts
  -- are promoted, into free pages above the high-water reserve and into pages of leaves
  predicted to be needed later than them -- never at the expense of a running request, so a
  wrong prediction costs copies, not correctness. Promoted nodes are marked until a match
  reaches them (radix.prefetch_used_pages).
* **Disk restore** (`Hierarchy.adopt`): a request whose prefix's KV was read from the disk
  tier before it was queued (kv/disk.py) gets it copied into fresh pages at its admission: its
  session's table points at them, and the tree holds their full pages like a computed prefix's.
* **Tail restore** (`Hierarchy.restore_tail`): a cut session points its page table at its history again
  (tree pages, promoted from the tier where needed), e.g. before a snapshot.
All of it runs in the engine's step thread, over the KV room's state (kv/room.py).
"""

from __future__ import annotations

from agentrt.kv.identity import RootKey
from agentrt.kv.kv_io import scatter_kv
from agentrt.kv.kv_manager import Sequence
from agentrt.kv.memory import HELD, UNPINNED
from agentrt.kv.radix import RadixCache
from agentrt.kv.room import KVRoom
from agentrt.prefixes import common_prefix


class Hierarchy:
    """Promotion, prefetch and tail restore over one engine's KV room."""

    def __init__(self, kv: KVRoom):
        self.kv = kv

    def promote_prefix(self, tokens: list[int], salt: RootKey, pinned: bool = True,
                       max_pages: int | None = None) -> tuple[int, int]:
        """Promote the demoted continuation of `tokens`' resident match; returns the token range
        [start, end) now resident again ((0, 0): nothing promoted). With `pinned` (an admission)
        room comes from every candidate, a session held for its due tools last (kv/memory.py:
        HELD), without it from unpinned candidates only (a prefetch); `max_pages` stops the path
        where it would take more."""
        radix = self.kv.radix
        if radix is None or radix.tier is None:
            return 0, 0
        path = radix.host_path(tokens, salt)
        if max_pages is not None:
            path = _within(path, max_pages, self.kv.cfg.page_size)
        if not path:
            return 0, 0
        start = path[0].start
        end = min(len(tokens), path[-1].start + len(path[-1].key))
        n_pages = sum(len(x.key) for x in path) // self.kv.cfg.page_size
        if n_pages * radix.tier.copy_s_per_page >= self.kv.costs.recompute_s(end - start):
            return 0, 0
        return start, self._promote_path(radix, path, n_pages, allow=None, pinned=pinned) or start

    def adopt(self, r) -> int:
        """Copy the KV `r` brought from the disk tier (r.restored) into fresh pages, when it
        covers more than the pool holds of r's prompt and memory allows; returns tokens adopted."""
        hit, r.restored, kv = r.restored, None, self.kv
        n = min(len(hit.tokens), len(r.target) - 1)
        if n <= 0 or hit.tokens[:n] != r.target[:n]:
            return 0
        held = common_prefix(r.seq.tokens, r.target) if r.seq.adapted == r.adapted else 0
        if kv.radix is not None:
            held = max(held, kv.radix.peek(r.target[:n], r.space))
        need = kv.kvm.pages_for(n)
        if n < held + kv.cfg.page_size or not kv.mem.reclaim(need):
            return 0
        pages, tokens = kv.alloc.alloc(need), list(r.target[:n])
        scatter_kv(kv.kvm.store, pages, hit.k[:, :n], hit.v[:, :n])
        kv.insert_prefix(tokens, pages, r.cache_salt, r.tag, r.adapted)
        if r.session is not None:  # (the session's table: every page, the partial last one too)
            kv.kvm.release(r.seq)
            r.seq.tokens, r.seq.pages, r.seq.adapted = tokens, pages, r.adapted
            r.session.disk_until = n
        else:
            kv.alloc.decref(pages)  # (the tree holds the full pages)
        kv.counters.prompt_restored += n
        return n

    def _promote_path(self, radix: RadixCache, path: list, n_pages: int, allow, pinned: bool = False,
                      mark: bool = False) -> int:
        """Promote `path` (top-down, nodes of `radix`) as far as memory allows; returns the end of what is resident.
        Room comes from the candidates reclaim() may take (pinned, queued and, last, held ones
        too for a request being admitted: recomputing instead would take them anyway -- the
        admission does not wait for a hold, scheduling/admission.py), never from dropping whole
        sessions."""
        ps, end = self.kv.cfg.page_size, 0
        radix.lock(path[-1])
        try:
            self.kv.mem.reclaim(n_pages, allow, level=HELD if pinned else UNPINNED, trim=False)
            for node in path:
                n = len(node.key) // ps
                if node.resident:
                    end = node.start + len(node.key)
                    continue
                parent = node.parent
                if self.kv.alloc.num_free < n or node.host is None or not (parent.resident or parent.parent is None):
                    break  # (room ran out, or making room took an ancestor out of the pool)
                radix.promote(node, self.kv.alloc.alloc(n))
                node.prefetched = mark
                self.kv.counters.promoted_pages += n
                end = node.start + len(node.key)
        finally:
            radix.unlock(path[-1])
        return end

    def prefetch_returning(self, due: list, max_pages: int, hold=None, growth: int = 0) -> int:
        """Promote back the cut histories of the sessions in `due` (waiting on tools that may
        return now; soonest first), each at most once per wait, about `max_pages` per call
        (one session at least); `hold(es)` re-pins a session brought back, which holds it
        (kv/memory.py::held) until that pin ends; `growth`: pages the running requests' next
        tokens need, left free; returns pages promoted."""
        radix, done = self.kv.radix, 0
        if radix is None or radix.tier is None or not radix.tier.used:
            return 0
        for es in due:
            n = sum(len(x.key) for x in radix.host_path(es.history, es.space)) // self.kv.cfg.page_size
            if done and done + n > max_pages:
                break  # (the next call goes on: one session per call at least, whatever its size)
            es.prefetch_from, es.prefetch_pages = len(es.seq.pages), 0  # (tried in this wait)
            room = self._headroom(growth) if n else 0
            if room <= 0:
                continue
            self.restore_tail(es, pinned=False, max_pages=room)  # (its history's head, where all of it does not fit)
            got = max(0, len(es.seq.pages) - es.prefetch_from)
            es.prefetch_pages = got
            self.kv.counters.prefetched_pages += got
            self.kv.counters.return_prefetched_pages += got
            if got and hold is not None:
                hold(es)
            done += got
        return done

    def prefetch(self, max_pages: int, hints=None, reserve=lambda: 0) -> int:
        """Promote demoted pages of the agents predicted to run next; returns pages promoted.
        `hints()`: {tag: static prefix tokens} of the stages the scheduler expects next (its
        workflow knowledge), first and only their prefixes; then the policy's chain. `reserve()`:
        pages the running requests may still need (the scheduler's projection), kept free; asked
        only when a path is weighed (most steps find nothing to prefetch)."""
        radix, policy = self.kv.radix, self.kv.policy
        if radix is None or radix.tier is None or not radix.tier.used or max_pages <= 0:
            return 0
        limit = hints() if hints is not None else {}
        dist = dict.fromkeys(limit, 0)
        for t, d in policy.distances().items():
            dist.setdefault(t, d)
        if not dist:
            return 0
        frontier = _frontier(radix, dist) if dist else {}
        if not frontier:
            return 0
        far, done, ps = len(dist) + 1, 0, self.kv.cfg.page_size
        leaves = self.kv.mem.candidates(0, None)  # (one scan: what making room could take)
        for tag, d in sorted(dist.items(), key=lambda kv: kv[1]):
            for path in frontier.get(tag, ()):
                if tag in limit:
                    path = [x for x in path if x.start < limit[tag]]
                if not path:
                    continue
                n = sum(len(x.key) for x in path) // ps
                if done + n > max_pages:
                    continue
                if n > self._spare_pages(reserve()) and n > sum(len(x.pages) for x in leaves if dist.get(x.tag, far) > d):
                    continue
                end = self._promote_path(radix, path, n, allow=lambda leaf: dist.get(leaf.tag, far) > d, mark=True)
                got = sum(len(x.key) for x in path if x.resident and x.start < end) // ps
                self.kv.counters.prefetched_pages += got
                done += got
            if done >= max_pages:
                break
        return done

    def _headroom(self, growth: int) -> int:
        """Pages a return prefetch may fill and keep: free pages and what it may take (unpinned
        candidates), less the high-water gap and the running requests' remaining prompts. Filling
        the reserve too only lent the pages: the running requests' growth may take held pages
        (HELD), so pages prefetched into their reserve left the pool unused. (Before sessions were
        held, every prefetched page that left unused in bench_agents' long case was taken back by
        another agent's admission promoting its own history: attach_prefix -> promote_prefix.)"""
        taken = sum(len(x.pages) for x in self.kv.mem.candidates(0, None))
        return self.kv.alloc.num_free + taken - self._gap() - growth

    def _gap(self) -> int:
        """Pages of the gap between the high-water mark and a full pool (kept free for decodes)."""
        cfg = self.kv.cfg
        return int((1 - cfg.high_water) * cfg.num_pages)

    def _spare_pages(self, reserve: int) -> int:
        """Free pages beyond `reserve` (the running requests' growth) and the high-water gap."""
        return max(0, self.kv.alloc.num_free - reserve - self._gap())

    def restore_tail(self, es, pinned: bool = True, max_pages: int | None = None) -> None:
        """Point an idle session's page table at its whole history again when pressure cut it:
        the tree's pages (promoted from the tier first) replace the shorter table. What neither
        holds any more stays cut (the next turn recomputes it)."""
        hist, seq = es.history, es.seq
        if self.kv.radix is None or es.busy or len(hist) <= len(seq.tokens) or hist[:len(seq.tokens)] != seq.tokens:
            return
        self.promote_prefix(hist, es.space, pinned, max_pages)
        m = self.kv.radix.match_prefix(hist, es.space)
        if m.length <= len(seq.tokens):
            return
        tmp = Sequence(seq.seq_id)
        self.kv.kvm.alias(tmp, hist[:m.length], m.pages)
        self.kv.kvm.release(seq)
        seq.tokens, seq.pages = tmp.tokens, tmp.pages


def _within(path: list, max_pages: int, page_size: int) -> list:
    """The head of `path` (top-down nodes) that takes at most max_pages pages."""
    out, n = [], 0
    for node in path:
        n += len(node.key) // page_size
        if n > max_pages:
            break
        out.append(node)
    return out


def _frontier(radix, dist: dict) -> dict[str, list[list]]:
    """Tag -> paths to promote: each demoted node of a predicted tag whose parent is resident
    (or a root), followed by its demoted descendants of the same tag along the most recently
    used chain. One walk of the tree."""
    out: dict[str, list[list]] = {}
    for node in radix.nodes():
        if node.parent is None or node.resident or node.tag not in dist or not (
                node.parent.resident or node.parent.parent is None):
            continue
        path = [node]
        while True:
            kids = [c for c in path[-1].children.values() if c.tag == node.tag and not c.resident]
            if not kids:
                break
            path.append(max(kids, key=lambda c: c.last_access))
        out.setdefault(node.tag, []).append(path)
    return out
