"""StepThread: the engine's step loop in one dedicated OS thread (see engine.py for why).

The thread owns the EngineCore: other tasks hand it commands through an inbox (a FIFO queue of
(run, fail) pairs), and what it answers (token events, a command's completion) goes through an
outbox delivered to the event loop in one batch per step through an anyio BlockingPortal. If the
thread dies, every pending and later caller gets EngineFailed; nothing hangs.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import structlog
from anyio.from_thread import BlockingPortal

from agentrt.engine.core import EngineCore
from agentrt.errors import ConfigError, EngineClosed, EngineFailed
from agentrt.kernels.native import release_thread_pool
from agentrt.records.request import TokenEvent

log = structlog.get_logger("agentrt.engine")
_NOTHING = object()  # sentinel: the inbox had no command
T = TypeVar("T")


class StepThread:
    """Runs `core`'s steps and the commands submitted to it, in one thread started by start()."""

    def __init__(self, core: EngineCore):
        self.core = core
        # commands for the step thread: (run, fail) pairs; fail(error) answers the caller
        # instead when the engine dies before running it. None = shut down.
        self._inbox: queue.SimpleQueue[tuple[Callable[[], object], Callable] | None] = queue.SimpleQueue()
        self._inbox_lock = threading.Lock()  # orders puts against close and death: none is lost
        self.failed: BaseException | None = None  # why the step thread died
        self._outbox: list[tuple[Callable[[Any], object], object]] = []
        self.lock = threading.Lock()  # held by the step thread while it mutates the core
        self._thread: threading.Thread | None = None
        self._portal: BlockingPortal | None = None
        self.closed = False

    # ---- lifecycle (event loop side) -------------------------------------------------
    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, portal) -> None:
        """Start the thread; its outbox batches are delivered through `portal`. The calling
        thread gives up its OpenMP workers first (kernels/native.py::release_thread_pool):
        the model's parallel regions run in the step thread from now on."""
        release_thread_pool()
        self._portal = portal
        self._thread = threading.Thread(target=self._loop, name="agentrt-engine", daemon=True)
        self._thread.start()

    async def begin(self, portal) -> None:
        """start(), from the event loop that owns the engine (Engine.__aenter__)."""
        self.start(portal)

    def close(self) -> None:
        """Refuse later commands and tell the thread to shut down after those queued."""
        with self._inbox_lock:
            self.closed = True
            self._inbox.put(None)
        self._notify()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    async def wait_closed(self) -> None:
        """After close(): wait (off the event loop) until the thread has shut down."""
        await anyio.to_thread.run_sync(self.join)

    async def end(self) -> None:
        """After wait_closed(): leave what begin() entered (nothing for a thread)."""

    def check_open(self) -> None:
        if not self.started:
            raise ConfigError("use the engine inside `async with Engine(...) as engine:`")
        if self.failed is not None:
            raise self.failure()
        if self.closed:
            raise EngineClosed("the engine is closed; create a new Engine")

    def failure(self) -> EngineFailed:
        """A fresh EngineFailed for one caller (never one instance raised in many tasks)."""
        e = EngineFailed(f"the engine's step thread stopped on an internal error "
                         f"({type(self.failed).__name__}: {self.failed}); see the log and create a new Engine")
        e.__cause__ = self.failed
        return e

    # ---- the step thread ------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # the thread must not die silently: answer every caller
            log.exception("engine step thread died")
            self._die(e)

    def _die(self, exc: BaseException) -> None:
        """Every pending and later call gets EngineFailed at once: the commands not run yet,
        the live requests' streams (the core's state is not trusted, so nothing is freed),
        the pool's waiters; later calls raise from check_open."""
        with self._inbox_lock:
            self.failed = exc
            pending = []
            while True:
                try:
                    pending.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
        for item in pending:
            if item is not None:
                try:
                    item[1](self.failure())
                except Exception:
                    log.exception("engine: answering a pending command failed")
        for r in list(self.core.waiting) + list(self.core.running):
            try:
                r.emit(TokenEvent(r.rid, (), finish_reason="error", error=self.failure()))
            except Exception:
                log.exception("engine: answering a live request failed")
        # the pool's async waiters are woken on the event loop (anyio events are not thread-safe)
        self._outbox.append((lambda _: self.core.pool.close(self.failure), None))
        self._flush()

    def _serve(self) -> None:
        while True:
            wake = None
            if self._idle():
                with self.lock:  # idle: time for prefetch before blocking (until the next is due)
                    wake = self.core.idle()
            cmd: object
            try:
                cmd = self._inbox.get(block=not self.core.has_work(), timeout=wake)
            except queue.Empty:
                cmd = _NOTHING
            if not self._turn(cmd):
                return
            self._flush()

    # ---- the loop's turn, shared with the simulated loop (sim/loop.py) ---------------------

    def _idle(self) -> bool:
        return not self.core.has_work() and self._inbox.empty()

    def _turn(self, cmd) -> bool:
        """One turn after the loop's wait: every queued command (`cmd` first; _NOTHING: none
        came), then a step if there is work. False: the loop shuts down."""
        while cmd is not _NOTHING:
            if cmd is None:
                self._shutdown()
                return False
            self._run_cmd(cmd[0])
            cmd = self._next_cmd()
        if self.core.has_work():
            self._step()
        return True

    def _next_cmd(self):
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return _NOTHING

    def _run_cmd(self, cmd: Callable[[], None]) -> None:
        # commands answer their callers themselves; one that raises hit a bug while mutating
        # the core, so it ends the thread (every caller gets EngineFailed) rather than going on
        # over state that may be corrupt
        with self.lock:
            cmd()

    def _step(self) -> None:
        # a fault attributable to one request fails it alone inside the step (EngineCore.fail);
        # anything raised here is not, so the core may be inconsistent: the thread ends and
        # _die answers every caller with EngineFailed (never a hang, never a silent corruption)
        with self.lock:
            self.core.step()

    def _shutdown(self) -> None:
        with self.lock:
            for r in list(self.core.waiting) + list(self.core.running):
                self.core.cancel(r.rid, "cancelled")
            self.core.masks.close()
            self.core.close_durable()
        self._flush()

    def _flush(self) -> None:
        if self._outbox:
            batch, self._outbox = self._outbox, []
            assert self._portal is not None  # (set by start(), before the thread runs)
            self._portal.start_task_soon(_deliver, batch)

    # ---- commands ---------------------------------------------------------------------
    def post(self, fn: Callable[[T], object], arg: T) -> None:
        """In the step thread: have fn(arg) run on the event loop after this step (batched)."""
        self._outbox.append((fn, arg))

    def submit(self, cmd: Callable[[], object], fail: Callable[[BaseException], None] = lambda e: None) -> None:
        """Queue cmd for the step thread; if the thread dies first, fail(EngineFailed) runs there
        instead (it must answer its caller through the outbox)."""
        with self._inbox_lock:
            self.check_open()
            self._inbox.put((cmd, fail))
        self._notify()

    def submit_cleanup(self, cmd: Callable[[], object]) -> None:
        """Queue a cleanup command; dropped once the engine is closed or dead."""
        with self._inbox_lock:
            if not self.closed and self.failed is None:
                self._inbox.put((cmd, lambda e: None))
        self._notify()

    def _notify(self) -> None:
        """A command was queued (the thread's blocking get wakes by itself; see SimSteps)."""

    async def invoke(self, fn: Callable[[], object], *, undo: Callable[[dict], None] | None = None) -> object:
        """Run fn in the step thread and return its result (or raise its exception). Without
        `undo` the wait is shielded (fn's effect must not be lost). With it, the caller's
        cancellation or timeout ends the wait at once and undo(box) runs in the step thread
        after fn (the inbox is FIFO): box holds fn's "value" or "error"."""
        done, box = anyio.Event(), dict[str, Any]()

        def answer() -> None:
            self._outbox.append((lambda _: done.set(), None))

        def cmd() -> None:
            try:
                box["value"] = fn()
            except BaseException as e:  # handed back to the caller
                box["error"] = e
            answer()

        def fail(e: BaseException) -> None:
            box["error"] = e
            answer()

        self.submit(cmd, fail)
        if undo is None:
            with anyio.CancelScope(shield=True):
                await done.wait()
        else:
            try:
                await done.wait()
            except BaseException:
                self.submit_cleanup(lambda: undo(box))
                raise
        if "error" in box:
            if undo is not None:
                self.submit_cleanup(lambda: undo(box))
            raise box["error"]
        return box.get("value")


async def _deliver(batch) -> None:
    deliver_now(batch)


def deliver_now(batch) -> None:
    """Run each (fn, arg) of an outbox batch on the event loop's thread."""
    for fn, arg in batch:
        try:
            fn(arg)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the consumer went away; its request is being cancelled
