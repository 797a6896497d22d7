"""Session: a public handle on a long-lived KV session (one agent's conversation), with its
branching operations (snapshot to disk, fork, rollback; `Engine.restore` reads a snapshot back).

Each operation runs in the engine's step thread (`kv/branching.py`) between two steps, so it
never races the step loop; file I/O runs in a worker thread, off the event loop."""

from __future__ import annotations

from pathlib import Path

import anyio

from agentrt.checks import check_int, check_optional_str, check_timeout
from agentrt.errors import ConfigError, SnapshotMismatch
from agentrt.kv import snapshot
from agentrt.model.fingerprint import model_fingerprint


class Session:
    """Holds one sequence of the pool's session region until closed. Each turn submits the
    full new prompt; the engine keeps the longest common prefix of what the session holds and
    prefills only the rest. Use as `async with await engine.open_session() as s:`."""

    def __init__(self, engine, es):
        self._engine, self._es = engine, es

    @property
    def engine(self):
        """The Engine that opened this session (a session belongs to one engine)."""
        return self._engine

    @property
    def engine_session(self):
        """The step thread's record of this session (request.py::EngineSession): what the
        engine submits requests on; read or change it only in the step thread."""
        return self._es

    @property
    def tokens(self) -> list[int]:
        """Token ids whose KV the session holds now (a copy)."""
        return self._engine.session_tokens(self._es)

    @property
    def closed(self) -> bool:
        return self._es.closed

    @property
    def cache_salt(self) -> str | None:
        """The salt its prefixes are cached under (shared only with requests of the same salt)."""
        return self._es.cache_salt

    async def close(self) -> None:
        await self._engine.close_session(self._es)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def expect_tools(self, tools) -> float:
        """Tell the engine this session's turn ended in calls of `tools` (names) and its next
        request comes when they return: its KV is kept (pinned) for a TTL chosen from those
        tools' observed durations and the cost of rebuilding it (kv/retention.py). Returns
        the TTL in seconds (0: not pinned). `Conversation.round()` calls it for you."""
        names = tuple(tools) if isinstance(tools, (list, tuple)) else None
        if names is None or not all(isinstance(t, str) and t for t in names):
            raise ConfigError(f"tools must be a list of tool names (non-empty strings), got {tools!r}")
        engine, es = self._engine, self._es
        if es.closed:
            return 0.0
        return await engine.run_in_step_thread(lambda: engine.core.expect_tools(es, names))

    # ---- branching ------------------------------------------------------------------
    async def snapshot(self, path) -> Path:
        """Write the tokens this session holds, their KV and the model's fingerprint to `path`
        (atomically); `Engine.restore(path)` on an engine with the same model continues from
        there. SessionBusy while a turn runs on the session. Returns the path."""
        path = snapshot.check_target(path)
        engine = self._engine
        data = await engine.run_in_step_thread(lambda: engine.core.branching.export(self._es))
        fingerprint = await anyio.to_thread.run_sync(model_fingerprint, engine.model)
        return await anyio.to_thread.run_sync(snapshot.write_snapshot, path, data, fingerprint)

    async def fork(self, tag: str | None = None, timeout: float | None = None) -> "Session":
        """A new session holding this one's KV, its pages shared copy-on-write (no KV is copied
        until one of the two writes into a shared page), so both continue the same history
        independently. It takes a sequence id like open_session (PoolExhausted after `timeout`;
        a cancelled wait leaks nothing); `tag` None keeps this session's. SessionBusy while a
        turn runs on this session."""
        check_optional_str("tag", tag)
        check_timeout("timeout (seconds; None: EngineConfig.acquire_timeout)", timeout)
        engine, es = self._engine, self._es
        return await engine.open_session_with(lambda sid: engine.core.branching.fork(es, sid, tag), timeout)

    async def rollback(self, n_tokens: int) -> None:
        """Forget the KV of the last `n_tokens` tokens the session holds (0 <= n_tokens <=
        len(tokens)), e.g. to retry a reply. The next turn recomputes from there. SessionBusy
        while a turn runs on the session."""
        n = check_int("n_tokens", n_tokens, min=0)
        engine = self._engine
        await engine.run_in_step_thread(lambda: engine.core.branching.rollback(self._es, n))


async def restore_session(engine, path, tag: str | None, cache_salt: str | None,
                          timeout: float | None) -> Session:
    """Engine.restore: read and check the snapshot in a worker thread (before a pool id is
    taken: a bad file costs nothing), then import it into a new session."""
    path = snapshot.check_path(path)

    def read() -> dict:
        return snapshot.read_snapshot(path, model_fingerprint(engine.model))

    data = await anyio.to_thread.run_sync(read)
    adapter = data.get("adapter")
    if adapter is not None and adapter["fingerprint"] not in engine.core.adapters.fingerprints():
        raise SnapshotMismatch(
            f"{path}: its KV was computed with the LoRA adapter {adapter['name']!r} (fingerprint "
            f"{adapter['fingerprint']}), which is not loaded here; load those weights "
            "(engine.load_adapter) and restore it again")
    tag = data["tag"] if tag is None else tag
    core = engine.core
    return await engine.open_session_with(lambda sid: core.branching.restore(sid, data, tag, cache_salt), timeout)
