"""The driver's side of a replica: `RemoteEngine` and `RemoteSession`, the Engine and Session
interface an agent's `Conversation` uses, over a Ray actor handle.

Prompts are encoded here (the tokenizer and chat format come from the replica once, at start),
so a conversation's messages and tokens never leave the driver: the replica holds only KV.
Grammars are described (`ConstraintSpec`) and built on the replica. A token event crosses back
per engine step. A replica that dies turns every call into `ReplicaLost`. `ChatAgentrt(engine=
remote)` works too (`ClusterRuntime.engine_for`): a LangGraph thread's sessions then live there.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrt.engine.shared import EngineShared
from agentrt.errors import ConfigError, ReplicaLost
from agentrt.workflow import Workflow

from .replica import ConstraintSpec


def _lost(exc: BaseException, name: str) -> BaseException:
    """A Ray failure of a dead actor -> ReplicaLost; anything else unchanged (a RayTaskError is
    an instance of its cause too, so a replica's ConfigError stays a ConfigError)."""
    import ray.exceptions as rex

    if isinstance(exc, (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError)):
        return ReplicaLost(f"replica {name!r} is gone ({type(exc).__name__}); the turn in flight is lost, "
                           "the conversation is kept: ask again (the cluster has moved the agent)")
    return exc


@dataclass(frozen=True)
class _ModelView:
    """What callers read of an Engine's model: its config."""

    cfg: Any


class RemoteGrammars:
    """`grammars_of(engine)` for a remote engine: constraint descriptions built on the replica."""

    def for_tools(self, tools: Any, tool_choice: Any = "auto", *, parallel_tool_calls: bool = True) -> ConstraintSpec:
        return ConstraintSpec("tools", (tools, tool_choice, parallel_tool_calls))

    def for_json_schema(self, schema: Any) -> ConstraintSpec:
        if not isinstance(schema, (dict, bool)):
            raise ConfigError(f"schema must be a JSON schema (dict or bool), got {type(schema).__name__}")
        return ConstraintSpec("json", (schema,))


class RemoteEngine:
    """One replica seen as an Engine (the subset agents and conversations use)."""

    def __init__(self, handle: Any, name: str, info: dict[str, Any], chat: Any, config: Any = None,
                 portal: Any = None, loop_thread_id: int | None = None) -> None:
        from agentrt.config import EngineConfig

        self.handle, self.name, self.info = handle, name, info
        self.config = config or EngineConfig()
        self.model = _ModelView(info["model_config"])
        # the driver loop this engine is used from, and a portal onto it (ChatAgentrt's sync calls)
        self.portal, self.loop_thread_id = portal, loop_thread_id
        self.tokenizer = chat.tokenizer
        self.max_context_tokens = info["max_context_tokens"]
        self.alive = True
        self._adapters: dict[str, Any] = {}  # name -> AdapterInfo of what this replica loaded
        # the chat format from the replica, grammars built there (conversation/engine_text.py reads these)
        self.shared = EngineShared(chat_format=chat, grammars=RemoteGrammars())

    started = True  # (the replica entered its engine; entering this handle does nothing)
    closed = False  # (a replica is lost, not closed: see alive)
    model_name = None  # (traces name a replica's model "local")

    async def __aenter__(self) -> "RemoteEngine":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None  # (the cluster shuts its replicas down)

    async def call(self, method: str, *args: Any) -> Any:
        """await handle.method.remote(*args), with a dead replica as ReplicaLost."""
        try:
            return await getattr(self.handle, method).remote(*args)
        except Exception as exc:  # noqa: BLE001 - mapped, re-raised
            raise self._failure(exc) from exc

    def _failure(self, exc: BaseException) -> BaseException:
        """The error to raise for `exc`; a dead replica is marked and becomes ReplicaLost."""
        err = _lost(exc, self.name)
        if isinstance(err, ReplicaLost):
            self.alive = False
        return err

    async def open_session(self, tag: str | None = None, cache_salt: str | None = None,
                           timeout: float | None = None, adapter: str | None = None,
                           key: str | None = None) -> "RemoteSession":
        sid = await self.call("open_session", tag, timeout, cache_salt, adapter, key)
        return RemoteSession(self, sid, tag, cache_salt)

    @property
    def state_store(self) -> None:
        """None: a replica's state store is its own (EngineConfig.state_dir/state_url there)."""
        return None

    async def load_adapter(self, name: str, path: str | Path, dtype: str | None = None) -> Any:
        """Engine.load_adapter on the replica (`path` as the replica's machine sees it)."""
        info = await self.call("load_adapter", name, str(path), dtype)
        self._adapters[name] = info
        return info

    async def unload_adapter(self, name: str) -> None:
        await self.call("unload_adapter", name)
        self._adapters.pop(name, None)

    def adapters(self) -> dict[str, Any]:
        """The adapters loaded on the replica through this handle, by name."""
        return dict(self._adapters)

    async def restore_bytes(self, data: bytes, tag: str | None = None) -> "RemoteSession":
        return RemoteSession(self, await self.call("restore", data, tag), tag)

    async def generate(self, prompt: Sequence[int], params: Any = None, *, session: "RemoteSession | None" = None,
                       constraint: ConstraintSpec | None = None, **request: Any) -> AsyncGenerator[Any, None]:
        import ray

        if session is not None and session.engine is not self:
            raise ConfigError(f"session {session.session_id} belongs to replica {session.engine.name!r}, "
                              f"not {self.name!r}")
        request = {k: v for k, v in request.items() if v is not None}
        sid = session.session_id if session is not None else None
        stream = self.handle.generate.remote(list(prompt), params, sid, constraint, request)
        done = False
        try:
            async for ref in stream:
                ev = await ref
                done = ev.finish_reason is not None
                yield ev
        except Exception as exc:  # noqa: BLE001 - mapped, re-raised
            raise self._failure(exc) from exc
        finally:
            if not done and self.alive:  # left early: the replica's request is cancelled and freed
                ray.cancel(stream)

    def stop(self, request_id: int) -> None:
        self.handle.stop.remote(request_id)

    def declare_workflow(self, workflow: Workflow) -> None:
        """Engine.declare_workflow on the replica (sent, not awaited, as `stop` is)."""
        self.handle.declare_workflow.remote(workflow)

    async def load(self) -> dict[str, Any]:
        return await self.call("load")


class RemoteSession:
    """A KV session held by a replica (the Session interface a Conversation uses)."""

    engine_session = None  # (the replica holds the step thread's record, not this process)

    def __init__(self, engine: RemoteEngine, session_id: int, tag: str | None, cache_salt: str | None = None) -> None:
        self.engine, self.session_id, self.tag, self.cache_salt = engine, session_id, tag, cache_salt
        self.closed = False

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.engine.alive:
            with contextlib.suppress(ReplicaLost):  # a replica that died took the session's KV with it
                await self.engine.call("close_session", self.session_id)

    async def expect_tools(self, tools: Sequence[str]) -> float:
        return await self.engine.call("expect_tools", self.session_id, list(tools))

    async def fork(self, tag: str | None = None, timeout: float | None = None) -> "RemoteSession":
        return RemoteSession(self.engine, await self.engine.call("fork", self.session_id, tag, timeout), tag,
                             self.cache_salt)

    async def rollback(self, n_tokens: int) -> None:
        await self.engine.call("rollback", self.session_id, n_tokens)

    async def snapshot_bytes(self) -> bytes:
        return await self.engine.call("snapshot", self.session_id)

    async def tokens(self) -> list[int]:
        return await self.engine.call("session_tokens", self.session_id)
