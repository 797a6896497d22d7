"""Session affinity for LangGraph: each model call is routed to a KV session by its run config.

LangGraph resends the whole history on every call. The key of a call is the run's `thread_id`,
the node's checkpoint namespace without its per-step task ids (`agent:<uuid>|tools:<uuid>` ->
`agent|tools`) and, for a parallel `Send`, its push index; so one node of one thread keeps one
session across turns and only the new messages are prefilled. `configurable["agentrt_session"]`
overrides the key; a call without a thread id is a transient request (the radix cache still
shares prefixes). The routing itself (ledger, idle TTL, LRU release) is the core's
`agentrt.conversation.router`, shared with the OpenAI-compatible server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrt.conversation.router import RoutedSession, SessionPolicy, SessionRouter, routed_conversation
from agentrt.errors import ConfigError

__all__ = ["RoutedSession", "SessionPolicy", "SessionRouter", "call_session", "routed_conversation",
           "routed_kwargs", "session_key"]


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
    path: Sequence[Any] = meta.get("langgraph_path") or ()  # (LangGraph's task path: a tuple)
    push = f"#{path[1]}" if len(path) > 1 and path[0] == "__pregel_push" else ""
    return f"{thread}/{node}{push}"


def call_session(session: Any, config: Mapping[str, Any] | None) -> str | None:
    """A model call's key: an explicit `session=` call argument, else its run config's."""
    if session is not None:
        if not isinstance(session, str) or not session:
            raise ConfigError(f"session must be a non-empty str, got {session!r}")
        return session
    return session_key(config)


def routed_kwargs(config: Any, kwargs: dict) -> dict:
    """kwargs with `session=` the key of `config`'s thread, unless a session is named already."""
    if kwargs.get("session") is None and isinstance(config, Mapping) and (key := session_key(config)) is not None:
        return {**kwargs, "session": key}
    return kwargs
