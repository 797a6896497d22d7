"""Session: a public handle on a long-lived KV session (one agent's conversation)."""

from __future__ import annotations


class Session:
    """Holds one sequence of the pool's session region until closed. Each turn submits the
    full new prompt; the engine keeps the longest common prefix of what the session holds and
    prefills only the rest. Use as `async with await engine.open_session() as s:`."""

    def __init__(self, engine, es):
        self._engine, self._es = engine, es

    @property
    def tokens(self) -> list[int]:
        """Token ids whose KV the session holds now (a copy)."""
        return self._engine.session_tokens(self._es)

    @property
    def closed(self) -> bool:
        return self._es.closed

    async def close(self) -> None:
        await self._engine.close_session(self._es)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
