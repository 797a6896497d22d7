"""The Responses API's stored responses: per tenant (API key id), bounded by count and TTL."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from ..protocol import ApiError


@dataclass
class Stored:
    tenant: str
    body: dict
    chain: list[dict]  # the chain's messages through this response's output
    session_key: str | None
    expires: float


class ResponseStore:
    """Stored responses: at most `max_count`, each for `ttl_s` seconds, per tenant."""

    def __init__(self, max_count: int, ttl_s: float) -> None:
        self.max_count, self.ttl_s = max_count, ttl_s
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, tenant: str, body: dict, chain: list[dict], session_key: str | None) -> None:
        self._items[body["id"]] = Stored(tenant, body, chain, session_key, time.monotonic() + self.ttl_s)
        while len(self._items) > self.max_count:
            self._items.popitem(last=False)

    def get(self, tenant: str, rid: str) -> Stored:
        """The tenant's stored response, or ApiError 404 (unknown, expired or another key's)."""
        s = self._items.get(rid)
        if s is None or s.tenant != tenant or s.expires < time.monotonic():
            raise ApiError(f"no response {rid!r} is stored for this API key (unknown, expired, deleted, or made "
                           "with store=false)", 404, param="response_id", code="response_not_found")
        return s

    def delete(self, tenant: str, rid: str) -> None:
        self.get(tenant, rid)
        del self._items[rid]

    def __len__(self) -> int:
        return len(self._items)
