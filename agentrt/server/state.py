"""What the routes share: the server's state (`app.state.agentrt`)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Request

from agentrt.conversation.router import SessionRouter

from .backends import Backends
from .config import ServerConfig
from .metrics import Metrics
from .protocol import ApiError
from .responses.store import ResponseStore


class ServerState:
    """What the routes share: the engines and their session routers (`backends`, set in the
    lifespan), limits, the stored responses."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.backends: Backends | None = None
        self.metrics = Metrics(self)
        self.active: dict[str, int] = {}  # API key id -> requests in flight
        self.responses = ResponseStore(config.max_stored_responses, config.response_ttl_s)

    @property
    def engine(self) -> Any:
        """A live engine (tokenizer, limits; the one engine without replicas)."""
        return None if self.backends is None else self.backends.engine

    @property
    def router(self) -> SessionRouter | None:
        """The first engine's session router (the only one without replicas)."""
        return None if self.backends is None else self.backends.routers[0]

    def caller(self, request: Request) -> str:
        """The caller's key id ("anon" without keys), or ApiError 401."""
        if not self.config.api_keys:
            return "anon"
        auth = request.headers.get("authorization", "")
        # Bearer (OpenAI's clients), or x-api-key (Anthropic's)
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "").strip()
        for k in self.config.api_keys:
            if token and hmac.compare_digest(token.encode(), k.encode()):
                return hashlib.sha256(k.encode()).hexdigest()[:12]
        raise ApiError("invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)", 401,
                       type="authentication_error", code="invalid_api_key")

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        if self.active.get(key, 0) >= self.config.max_concurrency_per_key:
            raise ApiError(f"too many concurrent requests for this API key (limit "
                           f"{self.config.max_concurrency_per_key}); retry later", 429, type="rate_limit_error",
                           code="rate_limit_exceeded")
        self.active[key] = self.active.get(key, 0) + 1
        try:
            yield
        finally:
            self.active[key] -= 1
