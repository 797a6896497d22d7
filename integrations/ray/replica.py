"""`EngineReplica`: one agentrt `Engine` inside a Ray actor (one per device: a GPU, or a CPU slice).

The actor is asynchronous: every method is a coroutine on the actor's event loop, and the engine
lives in one long-lived task on that loop (`_serve`), entered and closed there, as anyio wants.
`generate` is an async generator: Ray streams its token events back to the caller as they come
(an `ObjectRefGenerator`). Sessions are held here and named by an int id; grammars are built
here from a picklable `ConstraintSpec` (a compiled grammar's matcher cannot cross processes).
A session moves between replicas as bytes: `snapshot` (the snapshot file's contents: tokens, KV
and the model's fingerprint) and `restore`.

`ModelSpec` says how a replica gets its model: `load_model(source, ...)` in the replica's
process, or a picklable `factory()` (tests build a tiny random model that way).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrt.conversation.engine_text import grammars_of
from agentrt.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """A model a replica loads in its own process: a source for `load_model`, or a factory."""

    source: str | None = None
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    factory: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        if (self.source is None) == (self.factory is None):
            raise ConfigError("ModelSpec takes a source (a name, .gguf or HF directory) or a factory, not both")

    def load(self) -> Any:
        if self.factory is not None:
            return self.factory()
        if self.source is None:  # (__post_init__ leaves one of the two)
            raise ConfigError("ModelSpec has neither a source nor a factory")
        from agentrt.model.loaders.load import load_model

        return load_model(self.source, **self.load_kwargs)


@dataclass(frozen=True)
class ConstraintSpec:
    """A grammar to build on the replica: ("tools", tools, tool_choice, parallel) or ("json", schema)."""

    kind: str
    args: tuple

    def build(self, engine) -> Any:
        grammars = grammars_of(engine)
        if self.kind == "tools":
            tools, choice, parallel = self.args
            return grammars.for_tools(tools, choice, parallel_tool_calls=parallel)
        return grammars.for_json_schema(self.args[0])


class EngineReplica:
    """The body of the Ray actor (`ray.remote(EngineReplica)` in cluster.py)."""

    def __init__(self, spec: ModelSpec, engine_config: Any = None, threads: int = 1, name: str = "replica") -> None:
        import torch

        torch.set_num_threads(threads)
        self.name = name
        self._spec, self._config = spec, engine_config
        self._sessions: dict[int, Any] = {}
        self._next = 0
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._served: asyncio.Task | None = None
        self.engine: Any = None
        self._failure: BaseException | None = None

    async def start(self) -> dict[str, Any]:
        """Load the model and start the engine; returns what the driver needs to encode prompts."""
        if self._served is None:
            self._served = asyncio.get_running_loop().create_task(self._serve())
        await self._ready.wait()
        if self._failure is not None:
            raise self._failure
        eng = self.engine
        return {"max_context_tokens": eng.max_context_tokens, "model_config": eng.model.cfg}

    async def _serve(self) -> None:
        from agentrt.engine.engine import Engine

        try:
            lm = self._spec.load()
            async with Engine(lm, self._config) as engine:
                self.engine = engine
                self._ready.set()
                await self._stop.wait()
                for s in list(self._sessions.values()):
                    await s.close()
        except BaseException as exc:  # handed to start()'s caller
            self._failure = exc
            self._ready.set()
            raise

    def tokenizer(self) -> Any:
        """The model's tokenizer (the driver encodes prompts with it)."""
        return self.engine.tokenizer

    def ping(self) -> str:
        return self.name

    async def generate(self, prompt: list[int], params: Any, session_id: int | None = None,
                       constraint: ConstraintSpec | None = None, request: dict | None = None) -> AsyncIterator[Any]:
        session = self._session(session_id) if session_id is not None else None
        built = constraint.build(self.engine) if constraint is not None else None
        async for ev in self.engine.generate(prompt, params, session=session, constraint=built, **(request or {})):
            yield ev

    def stop(self, request_id: int) -> None:
        self.engine.stop(request_id)

    def declare_workflow(self, workflow: Any) -> None:
        self.engine.declare_workflow(workflow)

    async def open_session(self, tag: str | None = None, timeout: float | None = None,
                           cache_salt: str | None = None, adapter: str | None = None, key: str | None = None) -> int:
        return self._keep(await self.engine.open_session(tag=tag, cache_salt=cache_salt, timeout=timeout,
                                                         adapter=adapter, key=key))

    async def load_adapter(self, name: str, path: str, dtype: str | None = None) -> Any:
        return await self.engine.load_adapter(name, path, dtype)

    async def unload_adapter(self, name: str) -> None:
        await self.engine.unload_adapter(name)

    async def close_session(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            await session.close()

    async def expect_tools(self, session_id: int, tools: list[str]) -> float:
        return await self._session(session_id).expect_tools(tools)

    async def fork(self, session_id: int, tag: str | None = None, timeout: float | None = None) -> int:
        return self._keep(await self._session(session_id).fork(tag, timeout))

    async def rollback(self, session_id: int, n_tokens: int) -> None:
        await self._session(session_id).rollback(n_tokens)

    async def snapshot(self, session_id: int) -> bytes:
        """The session's snapshot file, as bytes (tokens, KV, model fingerprint)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = await self._session(session_id).snapshot(Path(tmp) / "session.kv")
            return path.read_bytes()

    async def restore(self, data: bytes, tag: str | None = None, timeout: float | None = None) -> int:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "session.kv"
            path.write_bytes(data)
            return self._keep(await self.engine.restore(path, tag=tag, timeout=timeout))

    def session_tokens(self, session_id: int) -> list[int]:
        return list(self._session(session_id).tokens)

    def load(self) -> dict[str, Any]:
        """What placement reads: KV occupancy held by sessions and requests (the prefix cache's
        evictable pages apart), queue depth, sessions, prefill/decode counters."""
        s = self.engine.stats()
        held = (s.pages_total - s.pages_free - s.pages_cached_only) / max(1, s.pages_total)
        return {"kv_occupancy": held, "kv_occupancy_with_cache": s.kv_occupancy, "waiting": s.waiting,
                "running": s.running,
                "sessions": len(self._sessions), "prompt_computed": s.prompt_computed,
                "prompt_cached": s.prompt_cached, "decode_tokens": s.decode_tokens, "steps": s.steps,
                "step_seconds": s.step_seconds}

    async def check(self) -> None:
        """The engine's invariants, checked in its step thread (tests)."""
        await self.engine.run_in_step_thread(self.engine.core.check_invariants)

    async def shutdown(self) -> None:
        self._stop.set()
        if self._served is not None:
            await self._served

    def _keep(self, session: Any) -> int:
        self._next += 1
        self._sessions[self._next] = session
        return self._next

    def _session(self, session_id: int) -> Any:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise ConfigError(f"replica {self.name!r} holds no session {session_id} (closed, or moved)") from None
