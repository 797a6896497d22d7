"""Engine: the async facade over EngineCore.

The step loop runs in one dedicated OS thread, not in an anyio task. Why: a step is a
CPU-bound torch forward of tens of milliseconds; inside an event-loop task it would freeze
every actor, tool call and stream for that long. torch releases the GIL inside its kernels, so
in a thread the loop stays responsive while the model runs. The thread (`StepThread`, loop.py)
owns EngineCore; other tasks talk to it through a command queue, and each step's token events
come back to the event loop in one batch through an anyio BlockingPortal (one cross-thread hop
per step, not per token).
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace

import anyio
from anyio.from_thread import BlockingPortal

from agentrt.checks import check_adapter_name
from agentrt.config import EngineConfig
from agentrt.engine.adapters import EngineAdapters
from agentrt.engine.core import EngineCore
from agentrt.engine.durable import restore_for
from agentrt.engine.lifetime import EngineHost
from agentrt.engine.loop import StepThread
from agentrt.engine.session import Session, restore_session
from agentrt.engine.shared import EngineShared
from agentrt.engine.validate import check_generate_args, check_open_session_args
from agentrt.errors import AgentrtError, ConfigError, EngineClosed
from agentrt.fingerprint import fnv1a
from agentrt.model.loaders.load import LoadedModel
from agentrt.records.request import TokenEvent, Usage
from agentrt.sampling import SamplingParams, make_generator
from agentrt.workflow import Workflow, task_of


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    finish_reason: str
    usage: Usage


class Engine(EngineAdapters):
    alive = True  # (in process: never lost as a Ray replica can be; see `closed`)

    def __init__(self, model, config: EngineConfig | None = None, *, policy=None,
                 eos_token_ids: tuple[int, ...] | None = None, executor=None, tokenizer=None):
        """`executor`: what runs the batches (default: the model). A simulated one
        (agentrt.sim.SimExecutor, run under agentrt.sim.run) makes the same engine a simulation:
        steps run on the event loop and take their modelled cost in virtual time. `tokenizer`: a
        bare model's (a DecoderModel's, a SimModel's; what chat formatting and grammars need); a
        LoadedModel brings its own."""
        if isinstance(model, LoadedModel):  # a loaded checkpoint: its tokenizer and source come with it
            self.model, source = model.model, model.source
            tokenizer = tokenizer or model.tokenizer
        else:  # a bare model (a DecoderModel, a SimModel)
            self.model, source = model, None
        self.tokenizer = tokenizer
        # the model's name in traces (gen_ai.request.model): a LoadedModel's source, else its architecture
        self.model_name = str(source or self.model.cfg.arch)
        if eos_token_ids is None:
            eos_token_ids = tuple(self.tokenizer.eos_token_ids) if self.tokenizer else ()
        self.config = config or EngineConfig()
        # the executor's clock (None: the wall clock) and step loop (None: a StepThread)
        clock = executor.clock() if executor is not None else None
        core = EngineCore(self.model, self.config, policy, eos_token_ids, executor=executor, clock=clock)
        # the step loop: its thread (a task on the loop when simulated), inbox and outbox
        make_steps = executor.make_steps if executor is not None else None
        super().__init__(core, (make_steps or StepThread)(core))
        if self.core.disk is not None:  # (its writer ranks records with the policy between two steps)
            self.core.disk.policy_lock = self._steps.lock
        self._loop_thread_id: int | None = None  # (set on entering)
        self._portal: BlockingPortal | None = None
        self._host = EngineHost()
        # what the layers above build once per engine and share (engine/shared.py)
        self.shared = EngineShared()

    # ---- lifecycle ------------------------------------------------------------------
    async def __aenter__(self) -> "Engine":
        """Start the engine: its step thread, and its portal in a task of its own on this loop
        (engine/lifetime.py), so no scope is left open in the caller's task."""
        if self._host.entered:
            raise ConfigError("this engine was entered already; create a new Engine")
        self._portal = await self._host.start(self._steps.begin, self._steps.end)
        self._loop_thread_id = threading.get_ident()  # (the thread running this event loop)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the engine completely: the step thread ends, every request and waiter gets
        EngineClosed, the portal closes. Callable from any task on the engine's loop, inside any
        task group or cancel scope; idempotent (leaving `async with` after it does nothing)."""
        if not self._steps.started:
            return
        if not self._steps.closed:
            self._steps.close()
            # wake every open_session/generate waiting for a pool slot with EngineClosed, now
            self.core.pool.close(lambda: EngineClosed("the engine closed while waiting for a sequence slot"))
        with anyio.CancelScope(shield=True):
            await self._steps.wait_closed()
        await self._host.stop()

    @property
    def started(self) -> bool:
        """True once the engine was entered (`async with`), whether closed since or not."""
        return self._steps.started

    @property
    def closed(self) -> bool:
        """True once the engine was closed (aclose / leaving `async with`)."""
        return self._steps.closed

    @property
    def state_store(self):
        """The durable state store (agentrt/state; None without EngineConfig.state_dir/state_url)."""
        return self.core.state

    @property
    def portal(self):
        """The blocking portal onto the engine's event loop (None before `async with`): how
        callers on other threads run coroutines there."""
        return self._portal

    @property
    def loop_thread_id(self) -> int | None:
        """The id of the thread whose event loop the engine was entered in (None before)."""
        return self._loop_thread_id

    async def close_session(self, es) -> None:
        """Release an engine session's sequence (a no-op once the engine is closed)."""
        await self._close_session(es)

    # ---- public API -----------------------------------------------------------------
    async def open_session(self, tag: str | None = None, cache_salt: str | None = None,
                           timeout: float | None = None, adapter: str | None = None,
                           key: str | None = None) -> Session:
        """A long-lived KV session from the session region of the pool (PoolExhausted after
        `timeout`, default EngineConfig.acquire_timeout); its turns run `adapter` (a loaded
        adapter's name) unless a call names another. `key`: a stable conversation key; with a
        state dir (EngineConfig.state_dir) the state store's registry lists the session's KV
        under it. Whatever the key, a session whose prompt's prefix the disk tier holds gets
        that KV back instead of computing it (kv/disk.py)."""
        self._check_open()
        check_open_session_args(tag, cache_salt, timeout)
        check_adapter_name("adapter", adapter)
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigError(f"key must be a non-empty str or None, got {key!r}")
        return await self.open_session_with(lambda sid: self.core.open_session(sid, tag, cache_salt, adapter, key),
                                            timeout)

    async def restore(self, path, *, tag: str | None = None, cache_salt: str | None = None,
                      timeout: float | None = None) -> Session:
        """A new session holding the KV of a snapshot (`Session.snapshot`) written with this model
        and dtype (SnapshotMismatch otherwise); its next turn prefills only what follows it.
        `tag` None keeps the snapshot's; `cache_salt` and `timeout` as in open_session."""
        self._check_open()
        check_open_session_args(tag, cache_salt, timeout)
        return await restore_session(self, path, tag, cache_salt, timeout)

    async def open_session_with(self, make: Callable[[int], object], timeout: float | None) -> Session:
        """A session made by make(sid) in the step thread, sid taken from the pool's session
        region (PoolExhausted after `timeout`, default EngineConfig.acquire_timeout). make must
        be all or nothing: when it raises, the id goes back to the pool here."""
        t = self.config.acquire_timeout if timeout is None else timeout
        sid = await self.core.pool.acquire_async("session", t)

        def undo(box: dict) -> None:  # in the step thread, after the open: give the id back
            if box.get("value") is not None:
                self.core.close_session(box["value"])
            else:
                self.core.pool.release(sid)

        try:
            self._check_open()
        except BaseException:
            self.core.pool.release(sid)
            raise
        # cancellable: a caller's timeout ends the wait at once; undo frees the id (no leak)
        es = await self._steps.invoke(lambda: make(sid), undo=undo)
        return Session(self, es)

    async def _close_session(self, es) -> None:
        if self._steps.closed or self._steps.failed is not None:
            return
        try:
            await self._steps.invoke(lambda: self.core.close_session(es))
        except EngineClosed:
            pass  # closed (or failed) meanwhile: nothing is left to release

    async def generate(self, prompt: list[int], params: SamplingParams | None = None, *,
                       session: Session | None = None, cache_salt: str | None = None,
                       tag: str | None = None, constraint=None,
                       timeout: float | None = None, task: str | None = None,
                       workflow: str | None = None, adapter: str | None = None) -> AsyncGenerator[TokenEvent, None]:
        """Stream token events; the last has finish_reason and usage. Leaving the iteration
        early (break, cancel, exception) cancels the request and frees what it holds at the
        engine's next step. Use `contextlib.aclosing` when breaking out of the loop.
        `task`/`workflow` (default: the caller's `agentrt.task_scope`) and `tag` (the stage)
        are what workflow-aware scheduling (EngineConfig.scheduling_policy) sees. `adapter`:
        a loaded LoRA adapter's name (default: the session's, else the base model)."""
        async with aclosing(self._events(prompt, params, False, session=session, cache_salt=cache_salt, tag=tag,
                                         constraint=constraint, timeout=timeout, task=task,
                                         workflow=workflow, adapter=adapter)) as events:
            async for ev in events:
                yield ev

    async def _events(self, prompt, params, collect: bool, *, session, cache_salt, tag, constraint, timeout,
                      task, workflow, adapter=None) -> AsyncGenerator[TokenEvent, None]:
        """generate()'s stream; `collect`: the step thread gathers the tokens and hands over one
        event at the end (complete(): no wake-up of the caller per step)."""
        self._check_open()
        # types, finite ranges, a session of this engine: ConfigError before any work
        prompt, params = check_generate_args(self, prompt, params, session=session, cache_salt=cache_salt,
                                             tag=tag, timeout=timeout, task=task, workflow=workflow,
                                             constraint=constraint, adapter=adapter)
        task, workflow = task_of(task, workflow)
        seq_id = None
        if session is None:
            t = self.config.acquire_timeout if timeout is None else timeout
            seq_id = await self.core.pool.acquire_async("transient", t)
        es = session.engine_session if session is not None else None
        try:  # (the disk tier's KV for its prompt, read off the loop before it is queued)
            restored = await restore_for(self.core, prompt, es, cache_salt, adapter)
        except BaseException:
            if seq_id is not None:
                self.core.pool.release(seq_id)
            raise
        send, recv = anyio.create_memory_object_stream[TokenEvent](math.inf)
        box: dict = {}
        post = self._steps.post

        held: list[int] = []

        def emit(ev: TokenEvent) -> None:
            if collect and ev.finish_reason is None and ev.error is None:
                held.extend(ev.token_ids)  # (in the step thread)
                return
            if collect and held:
                ev = replace(ev, token_ids=(*held, *ev.token_ids))
            post(send.send_nowait, ev)

        def submit() -> None:
            try:
                gen = None if params.greedy else make_generator(_seed(prompt, params))
                box["req"] = self.core.add_request(
                    prompt, params, emit, seq_id=seq_id, session=session and session.engine_session,
                    cache_salt=cache_salt, tag=tag, constraint=constraint, generator=gen,
                    task=task, workflow=workflow, adapter=adapter, restored=restored)
            except BaseException as e:
                if seq_id is not None:
                    self.core.pool.release(seq_id)
                post(send.send_nowait, TokenEvent(0, (), "error", error=e))

        def fail(e: BaseException) -> None:
            post(send.send_nowait, TokenEvent(0, (), "error", error=e))

        try:
            self._steps.submit(submit, fail)
        except BaseException:
            if seq_id is not None:
                self.core.pool.release(seq_id)
            raise
        try:
            async with recv:
                async for ev in recv:
                    if ev.error is not None:
                        raise ev.error
                    if ev.finish_reason == "error":
                        raise AgentrtError("the engine step failed; see the log")
                    yield ev
                    if ev.finish_reason is not None:
                        return
        finally:
            # runs in the step thread after `submit` (the inbox is FIFO), so the request is
            # known there even when this consumer is cancelled before it was created
            self._steps.submit_cleanup(lambda: "req" in box and self.core.cancel(box["req"].rid))

    async def complete(self, prompt: list[int], params: SamplingParams | None = None, *,
                       session: Session | None = None, cache_salt: str | None = None, tag: str | None = None,
                       constraint=None, timeout: float | None = None, task: str | None = None,
                       workflow: str | None = None, adapter: str | None = None) -> Completion:
        """generate() to the end, as one Completion. The step thread gathers the tokens and hands
        them over once (no wake-up of the caller per step)."""
        toks: list[int] = []
        args = dict(session=session, cache_salt=cache_salt, tag=tag, constraint=constraint, timeout=timeout,
                    task=task, workflow=workflow, adapter=adapter)
        async with aclosing(self._events(prompt, params, True, **args)) as stream:
            async for ev in stream:
                toks.extend(ev.token_ids)
                if ev.finish_reason is not None and ev.usage is not None:  # (every final event has usage)
                    return Completion(toks, ev.finish_reason, ev.usage)
        raise AgentrtError("the request ended without a final event")

    def declare_workflow(self, workflow: Workflow) -> None:
        """Tell the scheduler the DAG of the tasks that name `workflow.name` (agentrt.workflow);
        tasks without a declared workflow are scheduled on the transitions the engine learns."""
        if not isinstance(workflow, Workflow):
            raise ConfigError(f"declare_workflow takes an agentrt.Workflow, got {type(workflow).__name__}")
        self.core.tasks.declare(workflow)  # (dict assignments: safe beside the step thread)

    def stop(self, request_id: int) -> None:
        """End a live request early (finish_reason "early_stop", e.g. when a tool-call parser
        says no useful output can follow). Its stream still ends with the final event and usage;
        tokens of the step in flight may arrive first. A finished request is left alone."""
        self._steps.submit(lambda: self.core.cancel(request_id, "early_stop"))



def _seed(prompt: list[int], params: SamplingParams) -> int:
    """Prompt-deterministic seed: FNV-1a of the prompt tokens, mixed with the user's seed."""
    return fnv1a(prompt) ^ ((params.seed or 0) * 0x9E3779B97F4A7C15)

