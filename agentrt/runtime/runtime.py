"""Runtime: owns the task group in which actors run, and (optionally) the engine.

    async with Runtime(engine) as rt:
        ref = await rt.spawn(MyBehavior(), name="a")
        answer = await ref.ask("hello", timeout=5)
"""

from __future__ import annotations

from collections.abc import Callable
import anyio

from agentrt.errors import ActorError, ConfigError
from agentrt.runtime.actor import ActorContext, ActorRef, Behavior
from agentrt.runtime.supervision import Supervision


class Runtime:
    def __init__(self, engine=None, *, default_mailbox: int = 64,
                 default_supervision: Supervision | None = None, tool_threads: int = 8):
        self.engine = engine
        self.default_mailbox = default_mailbox
        self.default_supervision = default_supervision or Supervision()
        self.tool_limiter = anyio.CapacityLimiter(tool_threads)  # sync tools' worker threads
        self._actors: dict[str, ActorRef] = {}
        self._tg = None
        self._owns_engine = False

    async def __aenter__(self) -> "Runtime":
        if self.engine is not None and self.engine._thread is None:
            await self.engine.__aenter__()
            self._owns_engine = True
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        for ref in list(self._actors.values()):
            ref._send.close()  # drain and stop
        try:
            await self._tg.__aexit__(*exc)
        finally:
            if self._owns_engine:
                await self.engine.aclose()

    def _check(self) -> None:
        if self._tg is None:
            raise ConfigError("use the runtime inside `async with Runtime(...) as rt:`")

    async def spawn(self, behavior: Behavior, *, name: str | None = None,
                    mailbox_size: int | None = None, supervision: Supervision | None = None) -> ActorRef:
        """Start an actor; names are unique while the actor lives."""
        self._check()
        name = name or getattr(behavior, "name", None) or f"actor-{len(self._actors) + 1}"
        if name in self._actors and not self._actors[name].stopped:
            raise ActorError(f"an actor named {name!r} is already running; pick another name")
        size = self.default_mailbox if mailbox_size is None else mailbox_size
        if size < 1:
            raise ConfigError("mailbox_size must be >= 1")
        ref = ActorRef(name, behavior, size, supervision or self.default_supervision)
        self._actors[name] = ref
        started = anyio.Event()

        async def run() -> None:
            started.set()
            await ref.run(ActorContext(name, self))

        self._tg.start_soon(run)
        await started.wait()
        return ref

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
        return self.engine.grammars()

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

