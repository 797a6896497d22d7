"""An agent's conversation kept in the engine's state store (EngineConfig.state_dir / state_url),
under its stable name: a runtime restarted over the same state gets every agent's messages back
at its start, and the engine's disk KV tier gives their KV back at its next turn (only the new
messages are computed). Saved after each turn, off the event loop; an engine without a store
(or a remote one, whose store is its replica's) keeps nothing."""

from __future__ import annotations

import anyio
import structlog

log = structlog.get_logger("agentrt.runtime")


def agent_key(name: str) -> str:
    """The key an agent's conversation (and its session's registry row) is kept under."""
    return f"agent/{name}"


async def load(engine, name: str) -> list[dict] | None:
    store = engine.state_store
    return None if store is None else await anyio.to_thread.run_sync(store.get_conversation, agent_key(name))


async def save(engine, name: str, messages: list[dict]) -> None:
    store = engine.state_store
    if store is None:
        return
    try:
        await anyio.to_thread.run_sync(store.put_conversation, agent_key(name), list(messages))
    except (TypeError, ValueError) as e:  # (a message that is not JSON: the conversation stays in memory)
        log.warning("agent conversation not saved: a message is not JSON", agent=name, error=str(e))


async def forget(engine, name: str) -> None:
    store = engine.state_store
    if store is not None:
        await anyio.to_thread.run_sync(store.delete_conversation, agent_key(name))


def resumed(saved: list[dict], instructions: str) -> list[dict]:
    """A saved conversation under the agent's instructions of now (its system message replaced
    when they changed; the KV after it is then recomputed, never reused)."""
    rest = saved[1:] if saved and saved[0].get("role") == "system" else saved
    return ([{"role": "system", "content": instructions}] if instructions else []) + list(rest)
