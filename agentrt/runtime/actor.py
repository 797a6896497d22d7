"""Actors: a behaviour object, a bounded mailbox, one message at a time, supervised.

An actor is a task in the Runtime's task group. Its mailbox is an anyio memory object stream
with a bound (back-pressure: `tell` waits for space, `tell_nowait` raises MailboxFull). Each
message runs inside its own cancel scope, so `cancel()` stops the current message only.

Tasks (agentrt/workflow.py): a message carries the sender's task (`current_task()` when it is
sent), or a fresh task when sent from outside any `task_scope` (one user request = one task);
the actor handles it inside that task's scope, so the model requests of the turn, and the
messages it sends to other actors (say, from a tool), belong to the same task. `workflow=`
names the workflow of a fresh task (inside a task, its workflow is the task's).

Asks that could never be answered are refused: a message carries its chain of asks (the actors
whose handlers are waiting on it, in the same context as the task, so it follows tools and
LangGraph nodes), and ask() of an actor already in the caller's chain -- an agent asking itself
from a tool, A -> B -> A -- raises AskCycle at once instead of waiting forever.

Traces (agentrt/tracing/): a message carries its sender's OpenTelemetry context, current while
the actor handles it, so the work it causes (an agent's turn) is a child of the sender's span.
Logs: while it handles a message, structlog's context variables hold `actor` and `task`, so every
line logged meanwhile (by the runtime, a tool) names them (`tracing.add_trace_ids` adds the span).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import AsyncIterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio
import structlog
from anyio.streams.memory import MemoryObjectSendStream
from structlog.contextvars import bound_contextvars

from agentrt import tracing
from agentrt.errors import (
    ActorStopped,
    AskCycle,
    AskTimeout,
    ConfigError,
    EngineClosed,
    EngineFailed,
    MailboxFull,
    RequestCancelled,
)
from agentrt.runtime.supervision import RestartTracker, Supervision
from agentrt.workflow import TaskContext, current_task, new_task_id, task_scope

log = structlog.get_logger("agentrt.runtime")
# the actors whose handlers wait, through asks, on the code running now (outermost first)
_ASKS: contextvars.ContextVar[tuple] = contextvars.ContextVar("agentrt_ask_chain", default=())
_Reply = tuple[str, Any]  # (kind, value) to an asker: ("ok" | "error" | "event" | "end", value)


@runtime_checkable
class Behavior(Protocol):
    """What an actor does: `handle` answers one message. The optional hooks are protocols of their
    own, which the actor checks a behaviour against (`isinstance`): `Streams`, `Starts`, `Stops`."""

    async def handle(self, message: Any, ctx: ActorContext) -> Any: ...


@runtime_checkable
class Streams(Protocol):
    """Yields events for a streaming ask (`ask_stream`); without it the one answer is the stream."""

    def stream(self, message: Any, ctx: ActorContext) -> AsyncIterator[Any]: ...


@runtime_checkable
class Starts(Protocol):
    """Runs when the actor starts, and on each restart."""

    async def start(self, ctx: ActorContext) -> None: ...


@runtime_checkable
class Stops(Protocol):
    """Runs when the actor stops (`restarting`: supervision will start it again)."""

    async def stop(self, ctx: ActorContext, restarting: bool) -> None: ...


@runtime_checkable
class Forkable(Behavior, Protocol):
    """A behaviour `Runtime.fork` can branch (an Agent): a sibling not yet started, and how to
    release what that sibling holds if it never runs."""

    async def fork(self, name: str) -> Forkable: ...

    async def passivate(self) -> None: ...


@dataclass
class ActorContext:
    name: str
    runtime: Any  # the Runtime (runtime.py imports this module)
    restarts: int = 0
    reset_state: bool = False  # set on a restart whose policy is session="reset"


def message_task(workflow: str | None = None) -> TaskContext:
    """The task a message sent now belongs to: the sender's, or a fresh one of `workflow`."""
    if workflow is not None and (not isinstance(workflow, str) or not workflow):
        raise ConfigError(f"workflow must be a workflow's name (a non-empty str) or None, got {workflow!r}")
    outer = current_task()
    if outer is None:
        return TaskContext(new_task_id(), workflow)
    if workflow is not None and outer.workflow not in (None, workflow):
        raise ConfigError(f"this message is sent inside task {outer.task_id!r} of workflow {outer.workflow!r}, "
                          f"so it cannot start workflow {workflow!r}: a task follows one workflow; leave "
                          "workflow= out, or send it from outside the task_scope to start a new task")
    return TaskContext(outer.task_id, workflow or outer.workflow)


@dataclass(eq=False)
class Envelope:
    message: Any
    reply: MemoryObjectSendStream[_Reply] | None = None  # for ask/ask_stream; None for tell
    streaming: bool = False
    settled: bool = field(default=False)
    task: TaskContext | None = None  # the task the message belongs to (None: no task)
    chain: tuple = ()  # the actors waiting, through asks, on this message's answer
    trace: Any = None  # the sender's OpenTelemetry context (agentrt.tracing; None when off)

    def answer(self, value: Any) -> None:
        self._send(("ok", value))

    def fail(self, error: BaseException) -> None:
        self._send(("error", error))

    def finish_stream(self) -> None:
        self._send(("end", None))

    def event(self, ev: Any) -> None:
        if self.reply is not None:
            try:
                self.reply.send_nowait(("event", ev))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    def _send(self, item: _Reply) -> None:
        if self.reply is None or self.settled:
            return
        self.settled = True
        try:
            self.reply.send_nowait(item)
            self.reply.close()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass


class ActorRef:
    """Handle on a running actor: tell / ask / ask_stream / cancel / stop / join."""

    def __init__(self, name: str, behavior: Behavior, mailbox_size: int, supervision: Supervision):
        self.name, self.behavior, self.supervision = name, behavior, supervision
        self._send, self._recv = anyio.create_memory_object_stream[Envelope](mailbox_size)
        self._scope: anyio.CancelScope | None = None
        self._stopped = anyio.Event()
        self.error: BaseException | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def queued(self) -> int:
        """Messages waiting in the mailbox (the one being handled not counted)."""
        return self._recv.statistics().current_buffer_used

    @property
    def busy(self) -> bool:
        """True while the actor handles a message (False between messages)."""
        return self._scope is not None

    async def tell(self, message: Any, *, workflow: str | None = None) -> None:
        """Queue a message, waiting while the mailbox is full."""
        await self._put(Envelope(message, task=message_task(workflow), trace=tracing.capture()))

    def tell_nowait(self, message: Any, *, workflow: str | None = None) -> None:
        env = Envelope(message, task=message_task(workflow), trace=tracing.capture())
        try:
            self._send.send_nowait(env)
        except anyio.WouldBlock:
            raise MailboxFull(f"actor {self.name!r} has a full mailbox; use `await tell()` to wait") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(f"actor {self.name!r} has stopped{self._why()}") from None

    def _why(self) -> str:
        return f" after {type(self.error).__name__}: {self.error}" if self.error is not None else ""

    async def ask(self, message: Any, timeout: float | None = None, *, workflow: str | None = None) -> Any:
        """Send and wait for the answer; AskTimeout after `timeout` s (the message is cancelled).
        `workflow`: the workflow of the fresh task a message from outside any task starts."""
        task, chain = message_task(workflow), self._chain()
        send, recv = anyio.create_memory_object_stream[_Reply](1)
        env = Envelope(message, send, task=task, chain=chain, trace=tracing.capture())
        await self._put(env)
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            async with recv:
                kind, value = await recv.receive()
        if scope.cancelled_caught:
            env.settled = True
            self.cancel()
            raise AskTimeout(f"actor {self.name!r} did not answer within {timeout}s")
        if kind == "error":
            raise value
        return value

    async def ask_stream(self, message: Any, *, workflow: str | None = None) -> AsyncIterator[Any]:
        """Send and yield the behaviour's events as they come; ends with the final answer."""
        task, chain = message_task(workflow), self._chain()
        send, recv = anyio.create_memory_object_stream[_Reply](math.inf)
        env = Envelope(message, send, streaming=True, task=task, chain=chain, trace=tracing.capture())
        await self._put(env)
        async with recv:
            async for kind, value in recv:
                if kind == "error":
                    raise value
                if kind == "end":
                    return
                yield value

    def _chain(self) -> tuple:
        """The caller's chain of asks; AskCycle if this actor is already in it."""
        chain = _ASKS.get()
        if self in chain:
            path = " -> ".join(a.name for a in (*chain, self))
            raise AskCycle(f"actor {self.name!r} is waiting, up this chain of asks ({path}), for the caller: the "
                           "ask could never be answered. Use tell() for a message that needs no answer, or let "
                           "the caller do the work itself")
        return chain

    def cancel(self) -> None:
        """Cancel the message being handled now (the actor goes on with the next one)."""
        if self._scope is not None:
            self._scope.cancel()

    def close(self) -> None:
        """Close the mailbox without waiting: the actor finishes queued messages, then stops."""
        self._send.close()

    async def stop(self) -> None:
        """Close the mailbox; the actor finishes queued messages, then stops."""
        self.close()
        await self._stopped.wait()

    async def join(self) -> None:
        await self._stopped.wait()

    async def _put(self, env: Envelope) -> None:
        try:
            await self._send.send(env)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(f"actor {self.name!r} has stopped{self._why()}") from None

    # ---- the actor task ---------------------------------------------------------------
    async def run(self, ctx: ActorContext) -> None:
        tracker = RestartTracker(self.supervision)
        try:
            while await self._run_once(ctx, tracker):
                delay = tracker.next_delay() if self._restartable() else None
                if delay is None:
                    log.warning("actor stopped after failure", actor=self.name, restarts=tracker.total)
                    return
                await anyio.sleep(delay)
                ctx.restarts, ctx.reset_state = tracker.total, self.supervision.session == "reset"
        finally:
            self._send.close()
            with anyio.CancelScope(shield=True):
                async for env in self._recv:  # nobody will answer these any more
                    env.fail(ActorStopped(f"actor {self.name!r} has stopped{self._why()}"))
                self._recv.close()
            self._stopped.set()

    def _restartable(self) -> bool:
        """A crash on a closed or failed engine is not restarted: nothing a restart does brings
        the engine back, and the backoff would only delay every ask's error."""
        return not isinstance(self.error, (EngineClosed, EngineFailed))

    async def _run_once(self, ctx: ActorContext, tracker: RestartTracker) -> bool:
        """Run until the mailbox closes (False) or a handler crashes (True: maybe restart). A start
        that fails is a crash too (the runtime and the other actors go on). The behaviour's stop
        hears `restarting=True` only when supervision will restart it: a crash past the restart
        budget stops it for good, and it releases what it holds (an agent's session)."""
        if isinstance(self.behavior, Starts):  # (an optional hook)
            try:
                await self.behavior.start(ctx)
            except Exception as e:
                self.error = e
                log.exception("actor start failed", actor=self.name)
                return True
        crashed = False
        try:
            async for env in self._recv:
                if not await self._handle(env, ctx):
                    crashed = True
                    return True
            return False
        finally:
            if isinstance(self.behavior, Stops):  # (an optional hook)
                # shielded (a cancelled actor still releases what it holds), but bounded
                bound = ctx.runtime.shutdown_timeout
                with anyio.CancelScope(shield=True, deadline=anyio.current_time() + bound) as scope:
                    await self.behavior.stop(ctx, restarting=crashed and self._restartable() and tracker.can_restart())
                if scope.cancelled_caught:
                    log.warning("actor stop did not finish within shutdown_timeout", actor=self.name)

    async def _handle(self, env: Envelope, ctx: ActorContext) -> bool:
        task = task_scope(env.task.task_id, env.task.workflow) if env.task is not None else nullcontext()
        asks = _ASKS.set((*env.chain, self))
        ids = {"actor": self.name, "task": env.task.task_id} if env.task is not None else {"actor": self.name}
        with anyio.CancelScope() as scope, task, tracing.attached(env.trace), bound_contextvars(**ids):
            self._scope = scope
            try:
                if env.streaming and isinstance(self.behavior, Streams):  # (an optional hook)
                    async for ev in self.behavior.stream(env.message, ctx):
                        env.event(ev)
                    env.finish_stream()
                elif env.streaming:  # a plain behaviour streams its one answer
                    env.event(await self.behavior.handle(env.message, ctx))
                    env.finish_stream()
                else:
                    env.answer(await self.behavior.handle(env.message, ctx))
            except Exception as e:  # the crash goes to the asker and to supervision
                self.error = e
                log.exception("actor handler failed", actor=self.name)
                env.fail(e)
                return False
            except BaseException:  # cancelled from outside (runtime shutdown): the asker must not hang
                if not scope.cancel_called:  # (cancel() of this message is answered below)
                    env.fail(ActorStopped(f"actor {self.name!r} was stopped while handling the message"))
                raise
            finally:
                self._scope = None
                _ASKS.reset(asks)
        if scope.cancelled_caught:
            env.fail(RequestCancelled(f"the message to actor {self.name!r} was cancelled"))
        return True
