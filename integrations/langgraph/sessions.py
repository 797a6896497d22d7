"""Session affinity for LangGraph: each model call is routed to a KV session by its run config.

LangGraph resends the whole history on every call. The key of a call is the run's `thread_id`,
the node's checkpoint namespace without its per-step task ids (`agent:<uuid>|tools:<uuid>` ->
`agent|tools`) and, for a parallel `Send`, its push index; so one node of one thread keeps one
session across turns and only the new messages are prefilled. `configurable["agentrt_session"]`
overrides the key; a call without a thread id is a transient request (the radix cache still
shares prefixes).

Each routed session keeps a *ledger*: the fingerprints of the messages its tokens cover and
the token offsets of the message boundaries it knows. A call's prompt reuses the tokens of
the longest ledger prefix the new history repeats (the model's own replies stay exactly the
tokens it generated) and encodes the rest as a delta. A retry, an edited history or time
travel simply matches less; the engine then keeps the longest common prefix of the KV and
the prompt and truncates the rest, so the output stays correct.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentrt.errors import ConfigError, PoolExhausted

from .messages import canonical_json, fingerprint


@dataclass(frozen=True)
class SessionPolicy:
    """When routed sessions are released. `max_sessions`: beyond it the least recently used
    idle session is closed; `idle_ttl_s`: a session idle this long is closed (checked on each
    call; None keeps it until the model is closed)."""

    max_sessions: int = 32
    idle_ttl_s: float | None = 900.0

    def __post_init__(self) -> None:
        if isinstance(self.max_sessions, bool) or not isinstance(self.max_sessions, int) or self.max_sessions < 1:
            raise ConfigError(f"max_sessions must be an int >= 1, got {self.max_sessions!r}")
        if self.idle_ttl_s is not None and not self.idle_ttl_s > 0:
            raise ConfigError(f"idle_ttl_s must be > 0 or None, got {self.idle_ttl_s!r}")


def session_key(config: Mapping[str, Any] | None) -> str | None:
    """The routing key of a call from its run config (None: no thread, a transient request)."""
    config = config or {}
    conf = config.get("configurable") or {}
    if conf.get("agentrt_session") is not None:
        return str(conf["agentrt_session"])
    thread = conf.get("thread_id")
    if thread is None:
        return None
    meta = config.get("metadata") or {}
    ns = conf.get("checkpoint_ns") or meta.get("langgraph_checkpoint_ns") or ""
    node = "|".join(part.split(":", 1)[0] for part in ns.split("|")) if ns else ""
    path = meta.get("langgraph_path") or ()
    push = f"#{path[1]}" if len(path) > 1 and path[0] == "__pregel_push" else ""
    return f"{thread}/{node}{push}"


@dataclass(eq=False)
class RoutedSession:
    """One key's KV session and the ledger of what its tokens hold."""

    key: str
    session: Any
    tools_key: str = ""
    fps: list[str] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)  # messages covered -> token offset
    tokens: list[int] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def prompt(self, fmt, msgs: Sequence[Mapping[str, Any]], tools) -> tuple[list[int], int]:
        """(prompt tokens, messages reused from the ledger)."""
        k = 0
        if tools_key(tools) == self.tools_key:
            while k < min(len(self.fps), len(msgs)) and self.fps[k] == fingerprint(msgs[k]):
                k += 1
            while k and k not in self.ends:
                k -= 1
        if k == 0:
            return fmt.encode(msgs, tools=tools), 0
        base = self.tokens[:self.ends[k]]
        if k == len(msgs):
            return base + fmt.generation_prompt_tokens(), k
        return base + fmt.encode_delta(msgs[:k], msgs[k:], tools=tools), k

    def record(self, fmt, msgs, tools, reused: int, prompt: list[int], generated: list[int],
               assistant: Mapping[str, Any]) -> None:
        """After a call: the session's tokens are prompt + generated (closed as a turn)."""
        gen_prompt = fmt.generation_prompt_tokens()
        self.ends = {k: v for k, v in self.ends.items() if k <= reused}
        if prompt[len(prompt) - len(gen_prompt):] == gen_prompt:
            self.ends[len(msgs)] = len(prompt) - len(gen_prompt)
        self.tokens = prompt + fmt.encode_assistant_tokens(generated)
        self.fps = [fingerprint(m) for m in msgs] + [fingerprint(assistant)]
        self.ends[len(msgs) + 1] = len(self.tokens)
        self.tools_key = tools_key(tools)


def tools_key(tools) -> str:
    return canonical_json(tools or [])


class SessionRouter:
    """Key -> RoutedSession, on the engine's event loop. Sessions come from the engine's
    session region; when it is full the least recently used idle session is released."""

    def __init__(self, engine, policy: SessionPolicy):
        self.engine, self.policy = engine, policy
        self.sessions: dict[str, RoutedSession] = {}

    async def acquire(self, key: str) -> RoutedSession | None:
        """The key's session, locked by the caller (None: use a transient request, e.g. when a
        parallel call holds the key's session or no session can be opened)."""
        await self.release_idle()
        rs = self.sessions.get(key)
        if rs is None:
            session = await self._open(key)
            if session is None:
                return None
            rs = self.sessions[key] = RoutedSession(key, session)
        if rs.lock.locked():
            return None
        rs.last_used = time.monotonic()
        return rs

    async def _open(self, key: str):
        for _ in range(2):
            if len(self.sessions) >= self.policy.max_sessions and not await self._release_lru():
                return None
            try:
                return await self.engine.open_session(tag=key, timeout=0.0)
            except PoolExhausted:
                if not await self._release_lru():
                    return None
        return None

    async def _release_lru(self) -> bool:
        idle = [rs for rs in self.sessions.values() if not rs.lock.locked()]
        if not idle:
            return False
        await self.release(min(idle, key=lambda rs: rs.last_used).key)
        return True

    async def release_idle(self) -> None:
        ttl = self.policy.idle_ttl_s
        if ttl is None:
            return
        now = time.monotonic()
        for rs in [rs for rs in self.sessions.values() if not rs.lock.locked() and now - rs.last_used > ttl]:
            await self.release(rs.key)

    async def release(self, key: str) -> None:
        rs = self.sessions.pop(key, None)
        if rs is not None:
            await rs.session.close()

    async def release_prefix(self, prefix: str) -> int:
        keys = [k for k in self.sessions if k.startswith(prefix)]
        for k in keys:
            await self.release(k)
        return len(keys)
