"""An agent's conversation kept in the engine's state store (EngineConfig.state_dir / state_url),
under its stable name: a runtime restarted over the same state gets every agent's conversation
back at its start -- its messages and the exact token ids its KV covered -- and the engine's
disk KV tier gives that KV back at its next turn, so only the new messages are computed. Saved
after each turn, off the event loop; an engine without a store (or a remote one, whose store is
its replica's) keeps nothing."""

from __future__ import annotations

import anyio
import structlog

log = structlog.get_logger("agentrt.runtime")


def agent_key(name: str) -> str:
    """The key an agent's conversation (and its session's registry row) is kept under."""
    return f"agent/{name}"


async def load(engine, name: str) -> dict | None:
    """The agent's saved state ({conversation, next_call_id}), or None."""
    store = engine.state_store
    saved = None if store is None else await anyio.to_thread.run_sync(store.get_conversation, agent_key(name))
    return saved if isinstance(saved, dict) and "conversation" in saved else None


async def save(engine, name: str, conversation, next_call_id: int) -> None:
    """Keep the agent's conversation and where its call ids go on (a resumed agent never reuses an id)."""
    store = engine.state_store
    if store is None:
        return
    try:
        await anyio.to_thread.run_sync(store.put_conversation, agent_key(name),
                                       {"conversation": conversation.state(), "next_call_id": next_call_id})
    except (TypeError, ValueError) as e:  # (a message that is not JSON: the conversation stays in memory)
        log.warning("agent conversation not saved: a message is not JSON", agent=name, error=str(e))


async def forget(engine, name: str) -> None:
    store = engine.state_store
    if store is not None:
        await anyio.to_thread.run_sync(store.delete_conversation, agent_key(name))


def resume(conversation, saved: dict, instructions: str) -> None:
    """Put a saved conversation back: exactly, token ids included, when it ran under the same
    instructions and tools; else its messages under the instructions of now, encoded afresh (the
    KV after the first difference is then recomputed, never reused)."""
    state = saved["conversation"]
    msgs = state["messages"]
    system = [{"role": "system", "content": instructions}] if instructions else []
    rest = msgs[1:] if msgs and msgs[0].get("role") == "system" else msgs
    if msgs[:len(system)] == system and (rest is msgs) == (not system) and state["tools"] == conversation.tools:
        conversation.load_state(state)
    else:
        conversation.append(system + list(rest))
