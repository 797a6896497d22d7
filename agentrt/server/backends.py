"""Where the server's requests run: one in-process Engine, or engine replicas on Ray
(`agentrt serve --replicas N`, `integrations/ray`), each with its own session router.

Conversations are routed session-affine: a conversation's key (`prompt_cache_key`, a Responses
chain, an Anthropic session) stays on the replica that first served it, where its KV session
lives; a new key goes to the live replica routing the fewest sessions. A request without a key
goes round-robin. When a replica dies, its keys are forgotten and the request in flight is
tried again on a live replica before its first event: the conversation's history is in the
request (or the stored Responses chain), so the new replica prefills it and answers the same.
"""

from __future__ import annotations

from typing import Any

from agentrt.conversation.router import SessionPolicy, SessionRouter
from agentrt.errors import EngineClosed


class Backends:
    """The engines (an Engine, or RemoteEngines of Ray replicas) and their session routers."""

    def __init__(self, engines: list[Any], policy: SessionPolicy) -> None:
        self.engines = list(engines)
        self.routers = [SessionRouter(e, policy) for e in self.engines]
        self.home: dict[str, int] = {}  # conversation key -> the replica holding its session
        self._next = 0

    def live(self) -> list[int]:
        return [i for i, e in enumerate(self.engines) if e.alive and not e.closed]

    @property
    def engine(self) -> Any:
        """A live engine (the tokenizer, the context limit: the same on every replica)."""
        live = self.live()
        return self.engines[live[0] if live else 0]

    def pick(self, key: str | None) -> int:
        """The replica for a conversation key (sticky), or the next one for a keyless request."""
        live = self.live()
        if not live:
            raise EngineClosed("no engine replica is running; see the server log")
        if key is not None and self.home.get(key) in live:
            return self.home[key]
        n = len(self.engines)
        i = min(live, key=lambda j: (len(self.routers[j].sessions) if key is not None else 0, (j - self._next) % n))
        self._next = i + 1
        if key is not None:
            self.home[key] = i
        return i

    def lost(self, i: int) -> None:
        """Replica i died: its sessions went with it; its keys go elsewhere next time."""
        self.home = {k: j for k, j in self.home.items() if j != i}
        self.routers[i].sessions.clear()

    async def release_idle(self) -> None:
        for i in self.live():
            await self.routers[i].release_idle()

    async def release_all(self) -> None:
        for i in self.live():
            await self.routers[i].release_prefix("")

    @property
    def sessions(self) -> int:
        return sum(len(r.sessions) for r in self.routers)
