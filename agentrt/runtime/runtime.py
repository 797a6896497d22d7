"""Runtime: owns the task group in which actors run, and (optionally) the engine.

    async with Runtime(engine) as rt:
        ref = await rt.spawn(MyBehavior(), name="a")
        answer = await ref.ask("hello", timeout=5)

Leaving the block closes every mailbox and lets the actors finish what they hold, for at most
`shutdown_timeout` seconds; then whatever still runs (a tool without a timeout, a long
generation) is cancelled: its asker gets ActorStopped, and sync tools' worker threads are
abandoned (a thread cannot be killed; it runs on until its function returns).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio
import structlog
from anyio.abc import TaskGroup

from agentrt.conversation.engine_text import grammars_of
from agentrt.engine.like import EngineLike
from agentrt.errors import ActorError, ActorStopped, ConfigError, SessionBusy
from agentrt.runtime.actor import ActorContext, ActorRef, Behavior, Forkable, Streams
from agentrt.runtime.leases import SessionLeases
from agentrt.runtime.supervision import Supervision

log = structlog.get_logger("agentrt.runtime")

DEFAULT_SHUTDOWN_TIMEOUT = 10.0


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _timeout(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0 (math.inf: wait for ever), got {value!r}")
    return float(value)


class Runtime:
    """`shutdown_timeout`: seconds that leaving `async with` waits for running messages (tools
    included) before cancelling them; also bounds each behaviour's `stop`."""

    def __init__(self, engine: EngineLike | None = None, *, default_mailbox: int = 64,
                 default_supervision: Supervision | None = None, tool_threads: int = 8,
                 shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT):
        if default_supervision is not None and not isinstance(default_supervision, Supervision):
            raise ConfigError(f"default_supervision must be a Supervision, got {type(default_supervision).__name__}")
        self.engine = engine
        self.default_mailbox = _positive_int("default_mailbox", default_mailbox)
        self.default_supervision = default_supervision or Supervision()
        self.shutdown_timeout = _timeout("shutdown_timeout", shutdown_timeout)
        # sync tools' worker threads
        self.tool_limiter = anyio.CapacityLimiter(_positive_int("tool_threads", tool_threads))
        self.sessions = SessionLeases()  # agents' session ids; idle agents passivated when they run out
        self._actors: dict[str, ActorRef] = {}
        self._tg: TaskGroup | None = None  # set while the runtime is entered
        self._owns_engine = False

    async def __aenter__(self) -> "Runtime":
        if self.engine is not None and not self.engine.started:
            await self.engine.__aenter__()
            self._owns_engine = True
        self._tg = tg = anyio.create_task_group()
        await tg.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        tg = self._group()
        try:
            for ref in list(self._actors.values()):
                ref.close()  # finish what is queued, then stop
            if exc[1] is None:  # (on an error the task group cancels everything anyway)
                await self._wait_for_actors()
        finally:
            tg.cancel_scope.cancel()  # whatever still runs past the bound
            try:
                await tg.__aexit__(*exc)
            finally:
                if self._owns_engine and self.engine is not None:
                    await self.engine.__aexit__(None, None, None)

    async def _wait_for_actors(self) -> None:
        with anyio.move_on_after(self.shutdown_timeout):
            for ref in list(self._actors.values()):
                await ref.join()
        stuck = sorted(name for name, ref in self._actors.items() if not ref.stopped)
        if stuck:
            log.warning("runtime shutdown: cancelling actors still running after shutdown_timeout",
                        actors=stuck, shutdown_timeout=self.shutdown_timeout)

    def _group(self) -> TaskGroup:
        """The task group the actors run in (ConfigError outside `async with`)."""
        if self._tg is None:
            raise ConfigError("use the runtime inside `async with Runtime(...) as rt:`")
        return self._tg

    async def spawn(self, behavior: Behavior, *, name: str | None = None,
                    mailbox_size: int | None = None, supervision: Supervision | None = None) -> ActorRef:
        """Start an actor; names are unique while the actor lives."""
        tg = self._group()
        if isinstance(behavior, type):
            raise ConfigError(f"spawn() takes a behaviour instance, got the class {behavior.__name__}; "
                              f"call it: spawn({behavior.__name__}(...))")
        if not isinstance(behavior, (Behavior, Streams)):  # (a public input, checked before it runs)
            raise ConfigError(f"spawn() takes a behaviour with an async handle(message, ctx) method, "
                              f"got {type(behavior).__name__}")
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"an actor name must be a non-empty str (or None), got {name!r}")
        if supervision is not None and not isinstance(supervision, Supervision):
            raise ConfigError(f"supervision must be a Supervision or None, got {type(supervision).__name__}")
        # a user-supplied behaviour: a name is optional (Behavior)
        name = name or getattr(behavior, "name", None) or f"actor-{len(self._actors) + 1}"
        if not isinstance(name, str):
            raise ConfigError(f"the behaviour's name must be a str, got {name!r}; pass name=...")
        if name in self._actors and not self._actors[name].stopped:
            raise ActorError(f"an actor named {name!r} is already running; pick another name")
        size = self.default_mailbox if mailbox_size is None else _positive_int("mailbox_size", mailbox_size)
        ref = ActorRef(name, behavior, size, supervision or self.default_supervision)
        self._actors[name] = ref
        started = anyio.Event()

        async def run() -> None:
            started.set()
            await ref.run(ActorContext(name, self))

        tg.start_soon(run)
        await started.wait()
        return ref

    async def fork(self, source: ActorRef | str, *, name: str, mailbox_size: int | None = None,
                   supervision: Supervision | None = None) -> ActorRef:
        """Spawn a sibling of an idle agent actor: the same definition, and a conversation that is
        a fork of the source's (KV pages shared copy-on-write), so parallel sub-agents can each
        explore a branch of one history while prefilling only their own new messages. The source
        must be between messages (SessionBusy otherwise); supervision defaults to the source's."""
        self._group()
        ref = self.get(source) if isinstance(source, str) else source
        if not isinstance(ref, ActorRef):
            raise ConfigError(f"fork() takes an ActorRef or an actor name, got {type(source).__name__}")
        if ref.stopped:
            raise ActorStopped(f"actor {ref.name!r} has stopped; fork a running agent")
        behavior = ref.behavior
        if not isinstance(behavior, Forkable):  # (agents, and user behaviours that choose to)
            raise ConfigError(f"fork() forks agent actors; {ref.name!r} runs a {type(ref.behavior).__name__}")
        if not isinstance(name, str) or not name or (name in self._actors and not self._actors[name].stopped):
            raise ConfigError(f"the fork needs a new non-empty actor name, got {name!r}")
        if ref.busy:
            raise SessionBusy(f"actor {ref.name!r} is handling a message; fork it once its turn has finished")
        child = await behavior.fork(name)
        try:
            return await self.spawn(child, name=name, mailbox_size=mailbox_size,
                                    supervision=supervision or ref.supervision)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await child.passivate()
            raise

    async def actor(self, kind: str, key: str, factory: Callable[[str], Behavior], **kw) -> ActorRef:
        """Lazy activation by (kind, key), as in Orleans / AutoGen core: the actor is created
        on first use and reused while it lives."""
        name = f"{kind}/{key}"
        ref = self._actors.get(name)
        if ref is None or ref.stopped:
            ref = await self.spawn(factory(key), name=name, **kw)
        return ref

    def grammars(self):
        """The engine's grammar factory (compiled tool grammars are cached and shared by every
        agent with the same tools), created on first use."""
        return grammars_of(self.engine)

    def get(self, name: str) -> ActorRef:
        ref = self._actors.get(name)
        if ref is None:
            raise ActorError(f"no actor named {name!r}; running: {sorted(self._actors)}")
        return ref

    @property
    def actors(self) -> dict[str, ActorRef]:
        return dict(self._actors)

    async def stop_all(self) -> None:
        for ref in list(self._actors.values()):
            await ref.stop()

