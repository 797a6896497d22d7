"""Session leases: more agents than the engine has session ids, by passivating idle ones.

An agent holds a session id while it runs a turn and keeps it while idle, so its next turn
prefills only the new messages. When an agent needs an id and the engine has none free, the
least recently used idle agent of the same engine is *passivated*: its session is closed, which
hands its KV to the radix prefix cache (from where memory pressure demotes it to the tier, or
drops it). Its conversation keeps the messages and token ids, so the next turn *activates* it on
a fresh session: the prompt is the whole history, served from the radix cache or promoted from
the tier when still there, else prefilled again -- the same tokens either way (greedy output is
batch- and cache-invariant on the default path). With ids for every agent nothing is passivated.

An agent waiting for an id while every holder is busy waits for the next turn to end, up to the
engine's `acquire_timeout` (PoolExhausted after it: ids held outside the runtime, say). Waiters
are served in arrival order, one queue per engine: only the agent at the head of its engine's
queue takes an id (or passivates an idle agent for one), so a burst of agents onto few ids never
starves the one that asked first while later ones keep taking the ids that free up.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import Any

import anyio

from agentrt.engine import event_log
from agentrt.engine.session import Session
from agentrt.errors import ConfigError, PoolExhausted
from agentrt.runtime.persist import agent_key

_POLL_S = 0.25  # a session closed outside the runtime (not an agent's) frees an id without telling


class SessionLeases:
    """The runtime's agents and the sessions they hold (see the module docstring)."""

    def __init__(self) -> None:
        self._idle: OrderedDict[Any, Any] = OrderedDict()  # agent -> the session it held going idle
        self._freed = anyio.Event()
        self._queues: dict[int, deque] = {}  # id(engine) -> its waiting agents' tickets, oldest first
        self.passivations = 0
        self.activations = 0  # sessions opened for an agent that had been passivated

    async def acquire(self, agent: Any) -> None:
        """Give `agent` a session for a turn (its own, or a new one, passivating others for it)."""
        self._idle.pop(agent, None)
        if agent.session is not None and not agent.session.closed:
            return
        passivated = agent.conversation is not None and agent.conversation.session is None \
            and bool(agent.conversation.tokens)
        config = agent.engine.config  # (an Engine's or a Ray RemoteEngine's EngineConfig)
        if config.max_session_seqs == 0:
            raise ConfigError(f"agent {agent.spec.name!r} needs a KV session, and the engine has none "
                              "(EngineConfig.max_session_seqs=0)")
        wait = config.acquire_timeout
        deadline = anyio.current_time() + (math.inf if wait is None else wait)
        queue, ticket = self._queues.setdefault(id(agent.engine), deque()), object()
        queue.append(ticket)
        try:
            while True:
                if queue[0] is ticket:  # (first in line: take an id, passivating for one if need be)
                    try:
                        session = await agent.engine.open_session(tag=agent.spec.name, timeout=0.0,
                                                                  key=agent_key(agent.spec.name))
                        break
                    except PoolExhausted:
                        if await self.passivate_one(agent.engine):
                            continue
                if anyio.current_time() >= deadline:
                    raise PoolExhausted(
                        f"agent {agent.spec.name!r} waited {wait}s for a session id (EngineConfig.acquire_timeout) "
                        "while every id was held by a busy agent or outside the runtime; raise max_session_seqs "
                        "or acquire_timeout, or close sessions held outside the runtime")
                with anyio.move_on_after(min(_POLL_S, max(0.0, deadline - anyio.current_time()))):
                    await self._freed.wait()
        finally:
            queue.remove(ticket)
            if not queue:
                del self._queues[id(agent.engine)]
            self._wake()  # (the next in line goes on)
        agent.attach(session)
        self.activations += passivated
        if passivated:
            event_log.debug("agent.activated", agent=agent.spec.name, session=_sid(session),
                         tokens=len(agent.conversation.tokens))

    def release(self, agent: Any) -> None:
        """`agent` finished a turn: it keeps its session, idle (first to go when ids run out)."""
        if agent.session is not None and not agent.session.closed:
            self._idle[agent] = agent.session
            self._idle.move_to_end(agent)
        self._wake()

    def forget(self, agent: Any) -> None:
        """`agent` stopped (its session is closed by its own stop)."""
        self._idle.pop(agent, None)
        self._wake()

    def _wake(self) -> None:
        """Wake every waiter to look again (an id or an idle agent may be free, or the head moved)."""
        self._freed.set()
        self._freed = anyio.Event()

    async def passivate_one(self, engine: Any) -> bool:
        """Passivate the least recently used idle agent on `engine`; False when none is idle."""
        for agent, session in list(self._idle.items()):
            if agent.engine is not engine:
                continue
            del self._idle[agent]
            if agent.session is session:  # (a cluster may have moved it since)
                await agent.passivate()
                self.passivations += 1
                event_log.debug("agent.passivated", agent=agent.spec.name, session=_sid(session))
                return True
        return False

    @property
    def idle(self) -> int:
        return len(self._idle)


def _sid(session: Any) -> int | None:
    """An in-process session's engine id (None for another: a remote replica's)."""
    return session.engine_session.sid if isinstance(session, Session) else None
