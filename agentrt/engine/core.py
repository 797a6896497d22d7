"""EngineCore: the synchronous heart. One `step()` = admit, schedule one mixed PREFILL+DECODE
batch, run the model once, sample, and finish requests. Single-threaded by contract: only the
engine's step thread (or a test) calls it. See docs/architecture.md for the lifecycle."""

from __future__ import annotations

import itertools
import time
from collections import deque

import structlog
import torch

from agentrt.adapters.registry import AdapterRegistry
from agentrt.config import EngineConfig
from agentrt.constrain.fast_forward import forced_start
from agentrt.constrain.step_masks import MaskPrefetch
from agentrt.engine.chunks import forward_chunks
from agentrt.engine.clock import Clock, WallClock
from agentrt.engine.durable import open_durable, turn_ended
from agentrt.engine.event_log import EngineEvents
from agentrt.engine.executor import Executor, ModelExecutor, StepOutput
from agentrt.engine.faults import out_of_memory
from agentrt.engine.postprocess import Postprocess
from agentrt.engine.prefetch import PAGES_IDLE, PAGES_PER_STEP, RETURN_PAGES_PER_STEP, Prefetcher
from agentrt.engine.response_cache import ResponseCache
from agentrt.engine.seq_ids import SequencePool
from agentrt.engine.stats import Counters, EngineStats
from agentrt.engine.validate import check_against_core
from agentrt.errors import AgentrtError, ConfigError, DeviceOutOfMemory
from agentrt.kv.branching import Branching
from agentrt.kv.hierarchy import Hierarchy
from agentrt.kv.identity import BASE, Adapted, space
from agentrt.kv.kv_manager import Sequence
from agentrt.kv.registry import make_policy
from agentrt.kv.retention import Retention
from agentrt.kv.room import KVRoom
from agentrt.kv.sessions import EngineSession
from agentrt.kv.window import split_pool
from agentrt.model.batch import SeqChunk
from agentrt.model.decoder import DecoderModel
from agentrt.records.request import Request, State, TokenEvent
from agentrt.scheduling.policies import make_scheduling_policy
from agentrt.scheduling.scheduler import Scheduler
from agentrt.scheduling.tasks import TaskTracker

log = structlog.get_logger("agentrt.engine")


class EngineCore:
    def __init__(self, model: DecoderModel, config: EngineConfig | None = None, policy=None,
                 eos_token_ids: tuple[int, ...] = (), *, executor: Executor | None = None,
                 clock: Clock | None = None):
        """`executor` runs the planned batches (default: the model, ModelExecutor); `clock` gives
        every "now" (default: the wall clock). A simulated engine passes agentrt.sim's."""
        cfg = config or EngineConfig()
        self.model, self.eos = model, frozenset(eos_token_ids)
        path = None if cfg.forward_path == "auto" else cfg.forward_path
        self.executor: Executor = executor if executor is not None else ModelExecutor(model, path, cfg.cuda_graphs)
        # sliding-window layers' own pool (kv/window.py): the bytes saved hold more history
        self.cfg, num_local = (cfg, None) if self.executor.simulated else split_pool(cfg, model.cfg)
        cfg = self.cfg
        self.clock = clock if clock is not None else WallClock()
        self.pool = SequencePool(cfg.max_transient_seqs, cfg.max_session_seqs)
        self.counters, self.tasks = Counters(), TaskTracker()
        # the KV room (kv/room.py): an explicit policy wins over cfg.eviction_policy
        tier_bytes = cfg.kv_tier_bytes
        self.kv = kv = KVRoom(cfg, self.executor.allocate(cfg.num_pages, cfg.page_size, num_local),
                               policy if policy is not None else make_policy(cfg.eviction_policy),
                               self.counters, self.clock,
                               make_tier=(lambda store: self.executor.tier(store, tier_bytes)) if tier_bytes else None)
        # (the core's shortcuts into it)
        self.alloc, self.kvm, self.radix, self.policy = kv.alloc, kv.kvm, kv.radix, kv.policy
        self.mem, self.costs, self.sessions = kv.mem, kv.costs, kv.sessions
        self.hierarchy = Hierarchy(kv)
        self.retention = Retention(kv, cfg.tool_ttl_max_s)
        self.branching = Branching(kv, self.hierarchy)
        self.ticks = itertools.count(1)  # the logical clock: arrivals, admissions, sessions' last use
        self.events = EngineEvents(self.counters, kv)  # structlog events of state changes (off: ~free)
        self.scheduler = Scheduler(
            cfg, kv, self.hierarchy, self.tasks,
            make_scheduling_policy(cfg.scheduling_policy, aging_s=cfg.task_aging_s,
                                   exhaustive_agents=cfg.topas_exhaustive_agents, admission=cfg.topas_admission,
                                   switch_full=cfg.topas_switch_full),
            ticks=self.ticks, context=model.cfg.max_position_embeddings, clock=self.clock, events=self.events)
        self.responses = ResponseCache(cfg.response_cache_size) if cfg.response_cache_size else None
        self.masks = MaskPrefetch(self.counters, cfg.grammar_overlap and not self.executor.simulated)
        self.postprocess = Postprocess(cfg, model.cfg.max_position_embeddings, self.counters, self.clock,
                                       self.executor, self.kvm, self.fail, self._finish)
        self.prefetch = Prefetcher(kv, self.hierarchy, self.retention, self.tasks, self.counters, self.clock,
                                   lambda: self.scheduler.running, page_size=cfg.page_size,
                                   return_prefetch=cfg.enable_return_prefetch)
        self.step_observers: list = []  # f(chunks, seconds) after every step (calibration, traces)
        self.adapters = AdapterRegistry()  # LoRA adapters by name (engine.load_adapter)
        # durable state (engine/durable.py): the state store and the disk KV tier (None: off)
        self.state, self.disk = open_durable(cfg, model, kv, self.executor.simulated)
        self._rids = itertools.count(1)

    @property
    def waiting(self) -> deque[Request]:
        return self.scheduler.waiting

    @property
    def running(self) -> list[Request]:
        return self.scheduler.running

    # ---- sessions -------------------------------------------------------------------
    def open_session(self, seq_id: int, tag: str | None = None, cache_salt: str | None = None,
                     adapter: str | None = None, key: str | None = None) -> EngineSession:
        if adapter:
            self.adapters.get(adapter)  # (UnknownAdapter before the session exists)
        es = self.kv.open_session(seq_id, tag, cache_salt)
        es.adapter, es.key = adapter or None, key
        return es

    def close_session(self, sess: EngineSession) -> None:
        """Release the session's sequence; its full pages live on in the radix cache."""
        if sess.closed:
            return
        if self.sessions.get(sess.sid) is not sess:
            raise ConfigError("this session belongs to another engine; close it on the engine that opened it")
        for r in [r for r in itertools.chain(self.waiting, self.running) if r.session is sess]:
            self._finish(r, "cancelled")
        if self.disk is not None:
            self.disk.closing(sess.seq)  # (its write deferred for room, if any, goes now)
        sess.closed = True
        self.kv.insert_prefix(sess.seq.tokens, sess.seq.pages, sess.cache_salt, sess.tag, sess.seq.adapted)
        self.kvm.release(sess.seq)
        self.kv.forget_session(sess)
        self.pool.release(sess.sid)

    def expect_tools(self, sess: EngineSession, tools: tuple[str, ...]) -> float:
        """The session's turn ended in calls of `tools`: pin its KV for the retention TTL
        (kv/retention.py); returns the TTL in seconds (0: not pinned)."""
        return self.retention.pin(sess, tuple(tools))

    def idle(self) -> float | None:
        """Work for an idle step loop: prefetch (engine/prefetch.py). Returns the seconds until a
        session waiting on tools is due for its return prefetch (None: none is): the loop
        wakes then, in case its result has not arrived."""
        if self.disk is not None:
            self.disk.reap(self.alloc)
        if not self.cfg.enable_prefetch:
            return None
        with self.events.around():
            return self.prefetch(PAGES_IDLE, PAGES_IDLE)

    # ---- requests -------------------------------------------------------------------
    def add_request(self, prompt: list[int], params, emit, *, seq_id: int | None = None,
                    session: EngineSession | None = None, cache_salt: str | None = None,
                    tag: str | None = None, constraint=None, generator=None,
                    task: str | None = None, workflow: str | None = None, adapter: str | None = None,
                    restored=None) -> Request:
        """Queue a request. Transient requests bring a sequence id acquired from the pool;
        session requests use the session's sequence. Arguments come typed (Engine.generate checks
        them: engine/validate.py); what only the core knows is checked here, before any work.
        `adapter`: a loaded adapter's name (None: the session's, else the base model).
        `restored`: its prefix's KV read from the disk tier (engine/durable.py::restore_for)."""
        check_against_core(self, prompt, params, seq_id, session)
        if session is not None and self.sessions.get(session.sid) is not session:
            raise ConfigError("this session belongs to another engine; open a session on this one")
        salt = cache_salt if session is None else session.cache_salt
        lora, start = self.adapters.resolve(adapter if adapter is not None or session is None else session.adapter,
                                            prompt)
        adapted = BASE if lora is None else Adapted(lora.fingerprint, start)
        hit = self.responses.lookup(params, prompt, space(salt, adapted), constraint) \
            if self.responses is not None else None
        if hit is not None:
            return self._answer_from_cache(prompt, params, hit, emit, seq_id)
        if session is not None:
            self.retention.returned(session)
            session.busy, seq = True, session.seq
            cache_salt, tag = session.cache_salt, tag or session.tag
        else:
            assert seq_id is not None  # (check_against_core: a transient request brings its id)
            seq = Sequence(seq_id)
        stops = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos)
        req = Request(next(self._rids), list(prompt), params, seq, emit, session=session,
                      cache_salt=cache_salt, tag=tag, constraint=constraint, generator=generator,
                      stop_ids=stops, arrival=next(self.ticks), task=task, workflow=workflow,
                      submitted_s=self.clock.now(), adapter=lora, adapted=adapted, restored=restored)
        self.tasks.observe(task, workflow, tag, req.submitted_s, prompt, cache_salt)
        self.counters.prompt_submitted += len(prompt)
        self.waiting.append(req)
        if constraint is not None and (forced := forced_start(req, self.cfg, self.model.cfg.max_position_embeddings,
                                                              self.counters)):
            self.postprocess.emit_tokens(req, forced)
        return req

    def _answer_from_cache(self, prompt, params, hit, emit, seq_id) -> Request:
        """A repeat of a finished prompt: the same output with zero model work."""
        if seq_id is not None:
            self.pool.release(seq_id)
        req = Request(next(self._rids), list(prompt), params, Sequence(-1), emit,
                      state=State.FINISHED, output=list(hit.tokens), cached_tokens=len(prompt),
                      finish_reason=hit.finish_reason)
        self.counters.response_cache_hits += 1
        emit(TokenEvent(req.rid, hit.tokens, finish_reason=hit.finish_reason, usage=req.usage()))
        return req

    def cancel(self, rid: int, reason: str = "cancelled") -> bool:
        """End a request at once and free what it holds; False if it is not live."""
        for r in itertools.chain(self.waiting, self.running):
            if r.rid == rid:
                self._finish(r, reason)
                return True
        return False

    def fail(self, r: Request, exc: BaseException) -> None:
        """Fault isolation: an exception raised while the step handled r alone (its draft, its
        constraint, its sampling, its stop checks) ends r with finish_reason "error" and a typed
        error for its caller; what it holds is freed as on any finish, the others go on."""
        if r.state is State.FINISHED:
            return
        err = exc  # (logged by _finish: the request.failed event)
        if not isinstance(exc, AgentrtError):
            err = AgentrtError(f"request {r.rid} failed in the engine step ({type(exc).__name__}: {exc}); "
                               "the other requests go on")
            err.__cause__ = exc
        r.draft = []
        if r.state is State.RUNNING:
            self.kvm.truncate(r.seq, r.seq.num_cached)  # KV written past its tokens (a draft)
        self._finish(r, "error", error=err)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one iteration --------------------------------------------------------------
    def step(self) -> int:
        """One iteration, schedule -> run -> postprocess; returns the tokens that went through
        the model. (With state-change events on, engine/event_log.py names what the step moved.)"""
        with self.events.around():
            return self._step()

    def _step(self) -> int:
        if self.disk is not None:
            self.disk.reap(self.alloc)  # (pages the disk tier's finished writes kept)
        plan = self.scheduler.schedule()
        for r, err in plan.failed:
            self._finish(r, "error", error=err)
        for r, err in plan.faults:
            self.fail(r, err)
        if not plan.items:
            return 0
        t0, prefill = time.perf_counter(), plan.prefill_tokens
        try:
            chunks, out = self._run(plan.items)
        except torch.OutOfMemoryError as exc:  # (the step's requests fail; smaller steps go on)
            self._out_of_memory(plan.items, exc)
            return 0
        self.postprocess(plan.items, chunks, out.rows)
        self.kv.slide(self.running)
        dt = out.seconds if out.seconds is not None else time.perf_counter() - t0
        self.costs.observe(dt, prefill, len(plan.items))
        self.counters.step_seconds += dt
        for observe in self.step_observers:
            try:
                observe(chunks, dt)
            except Exception as e:  # an observer's fault is not the step's
                log.warning("step observer failed", observer=repr(observe), error=repr(e))
        if self.cfg.enable_prefetch:  # a few copies per step (a decode-only step's slack for more)
            self.prefetch(0 if prefill else PAGES_PER_STEP, RETURN_PAGES_PER_STEP)
        self.counters.steps += 1
        if self.cfg.debug_invariants:
            self.check_invariants()
        return sum(n for _, n in plan.items)

    def _out_of_memory(self, plan: list[tuple[Request, int]], exc: BaseException) -> None:
        sizes, message = out_of_memory(sum(n for _, n in plan), len(plan), self.scheduler.sizes, self.cfg.chunk_min,
                                       exc)
        self.scheduler.shrink(sizes)
        self.counters.oom_steps += 1
        for r, _ in plan:
            self.fail(r, DeviceOutOfMemory(message))

    def _run(self, plan: list[tuple[Request, int]]) -> tuple[list[SeqChunk], StepOutput]:
        """The executor's run of the planned chunks: (chunks, each chunk's logits rows)."""
        chunks = forward_chunks(plan)
        return chunks, self.masks.beside(plan, chunks, lambda: self.executor.run(plan, chunks, self.kvm.store,
                                                                                  self.cfg.page_size))

    def _finish(self, r: Request, reason: str, last: tuple[int, ...] = (), error: BaseException | None = None) -> None:
        """The one exit path of a request: frees or hands over everything it holds."""
        now = self.clock.now()
        if r.state is State.WAITING:
            self.waiting.remove(r)
        elif r.state is State.RUNNING:
            if r in self.running:  # (a request the memory manager failed has left it already)
                self.running.remove(r)
            self.tasks.served(r.tag, now - r.admitted_s)
        self.tasks.ended(r.task, now)
        r.state, r.finish_reason, r.finished_s = State.FINISHED, reason, now
        if reason == "error":
            self.events.failed(r, error)
        self.scheduler.drop_links(r)
        if self.responses is not None:
            self.responses.record(r, reason)
        self.kv.insert_prefix(r.seq.tokens, r.seq.pages, r.cache_salt, r.tag, r.seq.adapted)
        if reason != "error":
            turn_ended(self, r)  # (its KV to the disk tier, off the loop; engine/durable.py)
        if r.session is not None:
            r.session.busy, r.session.last_used = False, next(self.ticks)
            r.session.history = list(r.seq.tokens)
            self.kv.slide((), turn_end=r.seq)
        else:
            self.kvm.release(r.seq)
            self.pool.release(r.seq.seq_id)
        r.emit(TokenEvent(r.rid, last, finish_reason=reason, usage=r.usage(), error=error))

    def close_durable(self) -> None:
        """Finish the disk tier's queued writes and close the state store (at shutdown)."""
        if self.disk is not None:
            self.disk.close(self.alloc)
        if self.state is not None:
            self.state.close()

    def fail_all(self, error_of) -> None:
        """End every live request with finish_reason "error" and error_of(request) as its error."""
        for r in list(itertools.chain(self.waiting, self.running)):
            self._finish(r, "error", error=error_of(r))

    # ---- observability --------------------------------------------------------------
    def stats(self) -> EngineStats:
        return EngineStats.snapshot(self.counters, self.kv, self.scheduler.queues, self.scheduler, self.retention,
                                    len(self.tasks.tasks))

    def check_invariants(self) -> None:
        """Pages free xor referenced, refcounts equal to their holders (kv/room.py); pool ids
        free xor in use; each request in exactly the queue its state names; the task tracker
        within its bound."""
        live = list(itertools.chain(self.waiting, self.running))
        held = self.disk.held_pages() if self.disk is not None else []  # (pages of writes in flight)
        self.kv.check_invariants([r.seq.pages for r in live if r.session is None] + held)
        self.kv.check_windows(self.running)
        self.pool.check_invariants({r.seq.seq_id for r in live if r.session is None} | set(self.sessions))
        if len({id(r) for r in live}) != len(live):
            raise AssertionError("a request is queued twice")
        if any(r.state is not State.WAITING for r in self.waiting) or \
                any(r.state is not State.RUNNING for r in self.running):
            raise AssertionError("a request's state does not match its queue")
        if len(self.tasks.tasks) > self.tasks.max_tasks:
            raise AssertionError("the task tracker outgrew its bound")
