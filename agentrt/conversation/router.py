"""Session routing: a conversation key -> one KV session, reused across calls that resend the
whole history (LangGraph nodes, OpenAI-compatible clients with `prompt_cache_key`).

Each routed session keeps a *ledger* on top of a `Conversation` (the conversation core agents
use): the fingerprints of the messages the conversation holds. A call's prompt reuses the tokens
of the longest ledger prefix the new history repeats (the model's own replies stay the tokens the
conversation kept for them) and the conversation encodes the rest as a delta. A retry, an edited
history or time travel simply matches less; the engine then keeps the longest common prefix of
the KV and the prompt and truncates the rest, so the output stays correct.

`routed_conversation` is the one entry point callers use: the key's conversation, locked and
holding the call's messages, or a transient one (no key, or the key's session busy or not
available), whose prefixes the radix cache still shares.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from agentrt.conversation.conversation import Conversation
from agentrt.errors import ConfigError, PoolExhausted, SessionBusy


def canonical_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def fingerprint(msg: Mapping[str, Any]) -> str:
    """What decides a message's tokens: role, text, tool calls (name + arguments). Call ids are
    left out: the fallback format does not render them, and clients keep them anyway."""
    calls = [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in msg.get("tool_calls") or ()]
    return canonical_json([msg["role"], msg.get("content", ""), calls, msg.get("name", "")
                           if msg["role"] == "tool" else ""])


def _arguments(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


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


@dataclass(eq=False)
class RoutedSession:
    """One key's KV session, its conversation and the ledger of what the conversation holds."""

    key: str
    session: Any
    conversation: Conversation
    tools_key: str = ""
    tag: str | None = None  # the session's tag when not its key (the LangGraph node it serves)
    last_used: float = field(default_factory=time.monotonic)
    lock: anyio.Lock = field(default_factory=anyio.Lock)

    def sync(self, msgs: Sequence[Mapping[str, Any]], tools) -> int:
        """Make the conversation hold `msgs` (ready to generate); returns messages reused. The ledger
        is the fingerprints of the messages the conversation holds, as they were given."""
        conv, k = self.conversation, 0
        if tools_key(tools) != self.tools_key:
            conv.rewind(0)
            conv.tools, self.tools_key = (list(tools) if tools else None), tools_key(tools)
        held = conv.originals
        while k < min(len(held), len(msgs)) and fingerprint(held[k]) == fingerprint(msgs[k]):
            k += 1
        k = conv.rewind(k)
        conv.append(msgs[k:])
        return k


def tools_key(tools) -> str:
    return canonical_json(tools or [])


class SessionRouter:
    """Key -> RoutedSession, on the engine's event loop. Sessions come from the engine's
    session region; when it is full the least recently used idle session is released."""

    def __init__(self, engine, policy: SessionPolicy):
        self.engine, self.policy = engine, policy
        self.sessions: dict[str, RoutedSession] = {}

    async def acquire(self, key: str, tag: str | None = None, cache_salt: str | None = None) -> RoutedSession | None:
        """The key's session, locked by the caller (None: use a transient request, e.g. when a
        parallel call holds the key's session or no session can be opened). A new session is
        tagged `tag` (the node it serves: its agent, for the cache and the scheduler) or the key,
        and salted with `cache_salt` (its prefixes are shared only with requests of that salt)."""
        await self.release_idle()
        rs = self.sessions.get(key)
        if rs is not None and rs.session.cache_salt != cache_salt:
            raise ConfigError(f"session {key!r} was opened with another cache_salt; a key keeps one salt")
        if rs is None:
            session = await self._open(key, tag, cache_salt)
            if session is None:
                return None
            rs = self.sessions[key] = RoutedSession(key, session, Conversation(self.engine, session=session), tag=tag)
        if rs.lock.locked():
            return None
        rs.last_used = time.monotonic()
        return rs

    async def _open(self, key: str, tag: str | None = None, cache_salt: str | None = None):
        for _ in range(2):
            if len(self.sessions) >= self.policy.max_sessions and not await self._release_lru():
                return None
            try:
                return await self.engine.open_session(tag=tag or key, cache_salt=cache_salt, timeout=0.0, key=key)
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

    async def fork(self, src: str, dst: str) -> int:
        """Give `dst` a fork of every session of `src` (the key `src` itself and the keys of thread
        `src`: `src/...`, renamed `dst/...`): the same conversation and ledger on a session whose KV
        pages are shared copy-on-write. Sessions `dst` had are released first. Returns how many
        were forked; SessionBusy when a call is running on one of them (nothing is forked)."""
        if dst.startswith(src + "/") or src.startswith(dst + "/"):
            raise ConfigError(f"cannot fork {src!r} into {dst!r}: one contains the other's sessions")
        sources = [rs for k, rs in self.sessions.items() if k == src or k.startswith(src + "/")]
        if any(rs.lock.locked() for rs in sources):
            raise SessionBusy(f"a call is running on a session of {src!r}; fork it once the call has finished")
        for rs in sources:  # locked: no call starts on a source, and no release picks one
            rs.lock.acquire_nowait()
        try:
            await self.release_prefix(dst + "/")
            await self.release(dst)
            for rs in sources:
                key = dst + rs.key[len(src):]
                conv = await self._fork_conversation(rs.conversation, key, rs.tag or key)
                self.sessions[key] = RoutedSession(key, conv.session, conv, rs.tools_key, rs.tag)
        finally:
            for rs in sources:
                rs.lock.release()
        return len(sources)

    async def _fork_conversation(self, conv: Conversation, key: str, tag: str) -> Conversation:
        """conv.fork() into a session id of the pool, closing idle sessions for room as _open does."""
        while True:
            if len(self.sessions) >= self.policy.max_sessions and not await self._release_lru():
                raise PoolExhausted(f"no session can be released for {key!r}: every routed session is in use; "
                                    "raise SessionPolicy.max_sessions or wait for running calls")
            try:
                return await conv.fork(tag=tag, timeout=0.0)
            except PoolExhausted:
                if not await self._release_lru():
                    raise

    async def release_prefix(self, prefix: str) -> int:
        keys = [k for k in self.sessions if k.startswith(prefix)]
        for k in keys:
            await self.release(k)
        return len(keys)


@asynccontextmanager
async def routed_conversation(router: "SessionRouter", key: str | None, messages: Sequence[Mapping[str, Any]],
                              tools: Sequence[Mapping[str, Any]] | None, *, tag: str | None = None,
                              chat: Any = None, cache_salt: str | None = None) -> AsyncIterator[tuple[Conversation, int]]:
    """(conversation holding `messages`, messages reused from its ledger); the key's session is
    locked for the block. Without a key, or when its session is busy or cannot be opened, a
    transient conversation (0 reused). `cache_salt` namespaces the prefix cache (a tenant)."""
    rs = await router.acquire(key, tag, cache_salt) if key is not None else None
    if rs is None:
        conv = Conversation(router.engine, tools=tools, chat=chat, cache_salt=cache_salt)
        await conv.add(messages)
        yield conv, 0
        return
    async with rs.lock:
        reused = rs.sync(messages, tools)
        yield rs.conversation, reused
