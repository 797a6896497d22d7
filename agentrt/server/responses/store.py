"""The Responses API's stored responses: per tenant (API key id), bounded by count and TTL; in
memory, or in the durable state store (agentrt/state) when the engine has one, so a restarted
server continues every chain.

A response is stored when its body is built (responses/run.py::finish), before its last byte
is sent: with SQLite's synchronous commit, a reply the client received is retrievable after a
crash. Deleting a chain's last stored response also forgets its session's registry row and the
KV records only that session used (state/records.py::forget_session).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

from agentrt.state.records import forget_session
from agentrt.state.sql import SQLStore, StoredResponse

from ..protocol import ApiError


class ResponseStore:
    """Stored responses: at most `max_count`, each for `ttl_s` seconds, per tenant."""

    def __init__(self, max_count: int, ttl_s: float) -> None:
        self.max_count, self.ttl_s = max_count, ttl_s
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self.backend: SQLStore | None = None
        self.state_dir: Path | None = None

    def attach(self, backend: SQLStore | None, state_dir: str | None) -> None:
        """Keep responses in `backend` from now on (None: in memory); `state_dir` holds the KV
        records a deletion may free."""
        self.backend, self.state_dir = backend, Path(state_dir) if state_dir else None

    def put(self, tenant: str, body: dict, chain: list[dict], session_key: str | None) -> None:
        s = StoredResponse(body["id"], tenant, body, chain, session_key, time.time() + self.ttl_s)
        if self.backend is not None:
            self.backend.put_response(s, self.max_count)
            return
        self._items[s.id] = s
        while len(self._items) > self.max_count:
            self._items.popitem(last=False)

    def get(self, tenant: str, rid: str) -> StoredResponse:
        """The tenant's stored response, or ApiError 404 (unknown, expired or another key's)."""
        if self.backend is not None:
            s = self.backend.get_response(tenant, rid)
        else:
            s = self._items.get(rid)
            s = s if s is not None and s.tenant == tenant and s.expires >= time.time() else None
        if s is None:
            raise ApiError(f"no response {rid!r} is stored for this API key (unknown, expired, deleted, or made "
                           "with store=false)", 404, param="response_id", code="response_not_found")
        return s

    def delete(self, tenant: str, rid: str) -> str | None:
        """Delete the tenant's response (404 as get); returns the key of a session no stored
        response continues any more (its registry row and KV only it used are gone too)."""
        s = self.get(tenant, rid)
        if self.backend is None:
            del self._items[rid]
            left = any(x.session_key == s.session_key for x in self._items.values())
        else:
            self.backend.delete_response(tenant, rid)
            left = bool(s.session_key and self.backend.responses_of_session(s.session_key) > 0)
            if s.session_key and not left:
                forget_session(self.backend, self.state_dir, s.session_key)
        return s.session_key if s.session_key and not left else None

    def __len__(self) -> int:
        return self.backend.count_responses() if self.backend is not None else len(self._items)
