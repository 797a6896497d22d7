"""The scheduler: owns the request queues, admission and batch planning. One `schedule()` per
step returns the Plan the core runs:

1. **Decide** (scheduling/policies.py): the scheduling policy orders the ready requests and names
   the agents whose prefixes stay resident (`MemoryManager.keep`). FCFS takes arrival order
   without building a view; the others see a `SchedulingView` built here, and their decision
   time is recorded (`decision_us`).
2. **Admit** in that order while each request fits the cell budget and the footprint check
   (admission.Footprint); the first that does not fit ends the admission. A request
   about to be admitted is first pointed at the KV it can reuse (prefix.attach_prefix, with the
   demoted part of its match promoted by the memory hierarchy).
   Requests admitted together that share a block are grouped (prefix.group_new_requests).
3. **Plan the batch**: decodes first (each needs at most a page; its draft only if memory
   allows), then prefill chunks (admission.chunk_size) while memory allows. Memory comes from the
   memory manager: free pages, then cache and idle sessions' tails, then preempting the
   youngest running request; requests that must fail instead are returned in `Plan.failed`, and
   requests whose own planning raised (their draft) in `Plan.faults`.

The scheduler works on the KV room (kv/room.py) and the queues, and calls back into nothing:
what the core must do comes back in the Plan.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

from agentrt.kv.hierarchy import Hierarchy
from agentrt.kv.room import KVRoom
from agentrt.prefixes import common_prefix
from agentrt.records.request import Request, State
from agentrt.scheduling import admission
from agentrt.scheduling.admission import StepSizes
from agentrt.scheduling.policies import FCFS
from agentrt.scheduling.policy_base import Ready, SchedulingView
from agentrt.scheduling.preemption import drop_links, reserve, resolve_followers
from agentrt.scheduling.prefix import attach_prefix, group_new_requests
from agentrt.scheduling.queues import Queues
from agentrt.scheduling.speculation import choose_draft
from agentrt.scheduling.trace import DecisionRecord, DecisionTrace

REDECIDE_S = 0.2  # a decision is reused while the queues are unchanged, for at most this long
UPCOMING_S = 2.0  # a task whose last request ended this recently is expected back (a tool call)


@dataclass
class Plan:
    items: list[tuple[Request, int]]  # (request, tokens it feeds this step)
    failed: list[tuple[Request, BaseException]]  # out of memory for good: the core finishes them
    faults: list[tuple[Request, BaseException]] = field(default_factory=list)  # raised while planned

    @property
    def prefill_tokens(self) -> int:
        return sum(n for r, n in self.items if not r.draft and n > 1)


class Scheduler:
    def __init__(self, cfg, kv: KVRoom, hierarchy: Hierarchy, tasks, policy, *,
                 ticks, context: int, clock, events=None):
        """`ticks`: the engine's logical clock (an iterator of ints, shared with the core);
        `events`: the core's state-change events (engine/event_log.py; admissions and preemptions)."""
        self.cfg, self.kv, self.hierarchy = cfg, kv, hierarchy
        self.queues = Queues()  # (its own: the core and the KV room ask, never hold them)
        self.mem, self.kvm, self.radix = kv.mem, kv.kvm, kv.radix
        self.tasks, self.policy, self.ticks = tasks, policy, ticks
        self.context, self.clock, self.events = context, clock, events
        self.decision_us: deque[float] = deque(maxlen=4096)
        self._last: tuple | None = None  # (queue signature, time, order)
        # the per-decision trace (EngineConfig.decision_trace; None: off), and this pass's record
        self.trace = DecisionTrace(cfg.decision_trace) if cfg.decision_trace else None
        self._record: DecisionRecord | None = None
        # the static prefixes the policy keeps, evicted last: agent -> tokens (None: none kept)
        self.keep: dict[str, int] | None = None
        self.mem.consult(self)  # (what making room asks of the queues: the facts below)

    # ---- the facts making room asks for (kv/memory.py::SchedulingFacts) ------------------
    def queued_sessions(self) -> set[int]:
        return self.queues.queued_sessions()

    def kept_prefixes(self) -> dict[str, int] | None:
        return self.keep

    def evicted(self, leaf) -> None:
        if self.trace is not None:
            self.trace.evicted(leaf)

    @property
    def sizes(self) -> StepSizes:
        """The step's token budget and a prefill chunk's cap, as now (halved by shrink)."""
        return StepSizes(self.cfg.n_batch, self.cfg.chunk_max)

    def shrink(self, sizes: StepSizes) -> None:
        """Plan steps of these sizes from now on (after a device out-of-memory: engine/faults.py)."""
        self.cfg = dataclasses.replace(self.cfg, n_batch=sizes.n_batch, chunk_max=sizes.chunk_max)

    @property
    def waiting(self) -> deque:
        return self.queues.waiting

    @property
    def running(self) -> list:
        return self.queues.running

    def schedule(self) -> Plan:
        self.admit()
        return self.plan()

    # ---- admission ------------------------------------------------------------------
    def admit(self) -> None:
        admitted: list[Request] = []
        footprint = None  # (built on the first candidate: most steps admit nobody)
        for r in self._decide():
            if r.state is not State.WAITING:
                continue
            self.attach(r)
            footprint = footprint or admission.Footprint(self.running, self.cfg)
            if not footprint.admissible(r) or not footprint.fits(r):
                # held back: it lets go of its match, so what it would hold (its locked prefix, its
                # session's pages) stays reclaimable for the running requests (else they preempt
                # themselves for it, are admitted again and preempted again: a loop)
                self._detach(r)
                break
            footprint.add(r)
            self.waiting.remove(r)
            r.overtook = sum(w.arrival < r.arrival for w in self.waiting)  # (the policy's choice, for traces)
            r.state, r.admitted_at, r.admitted_s = State.RUNNING, next(self.ticks), self.clock.now()
            self.running.append(r)
            admitted.append(r)
            self.kv.counters.admissions += 1
            if self.events is not None and self.events.on:
                self.events.admitted(r)
            if self.trace is not None:
                self.trace.admitted(self._record, r)
        if self.cfg.enable_prefix_grouping and len(admitted) > 1:
            group_new_requests(admitted, self.cfg.prefix_group_k)

    def attach(self, r: Request) -> None:
        """Point a request about to be admitted at the KV it can reuse (once per admission)."""
        if r.attached:
            return
        r.attached = True
        promoted: list[int] = []
        salt = r.space
        if r.restored is not None:  # (its prefix's KV read from the disk tier: into pages first)
            self.hierarchy.adopt(r)
        reused = attach_prefix(r, self.kvm, self.radix, self.cfg.enable_session_reuse,
                               lambda toks: promoted.extend(self.hierarchy.promote_prefix(toks, salt)))
        if r.cached_tokens < 0:  # the request's first admission (not a re-admission)
            counters = self.kv.counters
            r.cached_tokens = reused
            counters.prompt_cached += reused
            if promoted and (n := max(0, min(reused, promoted[1]) - promoted[0])):
                counters.prompt_promoted += n
                tier = self.kv.tier
                assert tier is not None, "promoted pages come from the KV tier"
                r.promoted, r.promote_s = n, -(-n // self.cfg.page_size) * tier.copy_s_per_page
            self.kv.policy.on_request(r.tag)

    def _decide(self) -> list[Request]:
        self._record = None
        if not self.waiting:
            return []
        if isinstance(self.policy, FCFS) and self.trace is None:
            return list(self.waiting)
        sig, now = (tuple(r.rid for r in self.waiting), tuple(r.rid for r in self.running)), self.clock.now()
        if self._last is not None and self._last[0] == sig and now - self._last[1] < REDECIDE_S:
            if self.trace is not None and self.trace.records:  # (admissions of a reused decision are its own)
                self._record = self.trace.records[-1]
            return self._last[2]
        t0 = time.perf_counter()
        view = self.view(now)
        decision = self.policy.decide(view)
        self.decision_us.append((time.perf_counter() - t0) * 1e6)
        if self.trace is not None:
            self._record = self.trace.record(view, decision, self.policy.name)
        self.keep = None if decision.keep is None else {a: self.tasks.prefix_len(a) for a in decision.keep}
        self._last = (sig, now, decision.order)
        first = decision.order[0] if decision.order else None
        for r in self.waiting:  # a request attached earlier and not first now lets go of its match
            if r.attached and r is not first:
                self._detach(r)
        return decision.order

    def drop_links(self, r: Request) -> None:
        """Unlock r's radix path and cut the leader/follower links that involve it (r ends)."""
        drop_links(self.radix, self.running, r)

    def _detach(self, r: Request) -> None:
        drop_links(self.radix, self.running, r)
        if r.session is None:
            self.kvm.release(r.seq)
        r.attached = False

    # ---- what policies see ------------------------------------------------------------
    def view(self, now: float) -> SchedulingView:
        ready = [self._ready(r, False) for r in self.waiting]
        running = [self._ready(r, True) for r in self.running]
        upcoming = self.tasks.upcoming(now, UPCOMING_S)
        stages = {s for x in ready + running for s in (x.stage, *x.successors) if s is not None} | set(upcoming)
        prefix_len = {a: self.tasks.prefix_len(a) for a in stages}
        resident = {a: self._resident_prefix(a) for a in stages}
        budget = int(self.cfg.high_water * self.cfg.num_pages) * self.cfg.page_size
        costs = self.kv.costs
        return SchedulingView(ready, running, prefix_len, resident, budget, costs.recompute_s(1), now, upcoming,
                              costs.decode_s(1), costs.decode_per_seq_s, self.trace is not None)

    def _ready(self, r: Request, running: bool) -> Ready:
        tasks, tgt = self.tasks, r.target
        plen = tasks.prefix_len(r.tag)
        if running or r.attached:
            resident = r.seq.num_cached
        else:
            resident = self.radix.peek(tgt, r.space) if self.radix is not None else 0
            if r.session is not None:
                resident = max(resident, common_prefix(r.session.seq.tokens, tgt))
        held = len(r.seq.tokens) if running else len(tgt)
        new = r.params.max_tokens - len(r.output)
        cells = max(0, held - plen) + (admission.projected_cells(r) if running else new)
        work = r.remaining + new if running else len(tgt) - max(resident, min(plen, len(tgt))) + new
        return Ready(r, r.tag, r.task, r.submitted_s, tasks.arrival(r.task, r.submitted_s), resident, cells,
                     tasks.remaining(r.task, r.tag), tasks.cost(r.tag), tasks.successors(r.task, r.tag), work,
                     max(0, new))

    def _resident_prefix(self, stage: str) -> int:
        tokens, salt = self.tasks.prefix_of(stage)
        return self.radix.peek(tokens, salt) if self.radix is not None and tokens else 0

    # ---- the batch ------------------------------------------------------------------
    def plan(self) -> Plan:
        """Decodes first (each needs at most one page), then prefill chunks while memory
        allows. Memory is taken by evicting cache, then idle sessions, then preempting."""
        events = self.events if self.events is not None and self.events.on else None
        before = {r: r.preemptions for r in self.running} if events is not None else None
        with self.mem.planning():
            plan = self._plan()
        if events is not None and before is not None:
            for r, n in before.items():
                if r.preemptions > n:
                    events.preempted(r)
        return plan

    def _plan(self) -> Plan:
        resolve_followers(self.mem, self.running)
        decodes = [r for r in self.running if not r.in_prefill]
        prefills = [r for r in self.running if r.in_prefill and r.leader is None]
        plan: dict[Request, int] = {}
        failed: list = []
        faults: list = []
        # the pages every decode needs, reclaimed in one pass (each reserve below then finds them
        # free): one walk of the tree and idle sessions per step, not one per decode
        self.mem.reclaim(sum(self.kvm.write_cost(r.seq, r.seq.num_cached + r.remaining) for r in decodes))
        for r in decodes:
            if r.state is State.RUNNING and r in self.running:
                self._plan_decode(r, len(decodes), plan, failed, faults)
        chunk = admission.chunk_size(prefills, decodes, self.cfg)
        for r in prefills:
            if r.state is not State.RUNNING or r not in self.running:
                continue
            if plan and self.mem.over_high_water():
                self.mem.counters.deferred_chunks += 1
                break
            n = min(r.remaining, chunk)
            if not reserve(self.mem, self.queues, r, r.seq.num_cached + n, plan, not plan, failed):
                self.mem.counters.deferred_chunks += 1
                break
            plan[r] = n
        items = [(r, n) for r, n in plan.items() if r.state is State.RUNNING and r in self.running]
        return Plan(items, failed, faults)

    def _plan_decode(self, r: Request, n_decodes: int, plan: dict, failed: list, faults: list) -> None:
        try:
            r.draft = choose_draft(r, n_decodes, self.cfg, self.context)
        except Exception as e:  # r's own fault: the core fails r alone (EngineCore.fail)
            r.draft = []
            faults.append((r, e))
            return
        # a draft never preempts anyone: without room it is dropped, then the token is reserved
        # (a decode feeds its next token and the ids fast-forwarded after it: r.remaining)
        if r.draft and not reserve(self.mem, self.queues, r, r.seq.num_cached + r.remaining + len(r.draft), plan, False, failed):
            r.draft = []
        if r.draft or reserve(self.mem, self.queues, r, r.seq.num_cached + r.remaining, plan, True, failed):
            if r.state is State.RUNNING and r in self.running:
                plan[r] = r.remaining + len(r.draft)
