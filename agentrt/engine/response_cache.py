"""Prompt-deterministic response cache (an LRU of full responses).

Each request's generator is seeded from the FNV-1a hash of its prompt (and the user's seed),
so the same prompt gives the same output at any temperature; an exact repeat is answered from
here with zero model work. The key holds everything the output depends on: the model, the
sampling parameters, the full prompt tokens and the cache salt. Benchmarks that measure fresh
work turn it off (size 0).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, NamedTuple

from agentrt.kv.identity import RootKey


class CachedResponse(NamedTuple):
    tokens: tuple[int, ...]
    finish_reason: str


class ResponseCache:
    def __init__(self, max_entries: int):
        self.max_entries = max_entries
        self._lru: OrderedDict[Hashable, CachedResponse] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(model_id: str, params, prompt: list[int], salt: RootKey) -> Hashable:
        return (model_id, params, tuple(prompt), salt)

    def lookup(self, params, prompt: list[int], salt: RootKey, constraint=None) -> CachedResponse | None:
        """The cached response of a request (never of a constrained one: its grammar is not in
        the key, and such requests are not cached)."""
        return None if constraint is not None else self.get(self.key("model", params, prompt, salt))

    def record(self, r, reason: str) -> None:
        """Keep a finished request's output: one that ended by itself (stop, length) and was
        not constrained (lookup's rule)."""
        if r.constraint is None and reason in ("stop", "length"):
            self.put(self.key("model", r.params, r.prompt, r.space), CachedResponse(tuple(r.output), reason))

    def get(self, key: Hashable) -> CachedResponse | None:
        hit = self._lru.get(key)
        if hit is None:
            self.misses += 1
            return None
        self._lru.move_to_end(key)
        self.hits += 1
        return hit

    def put(self, key: Hashable, value: CachedResponse) -> None:
        if self.max_entries <= 0:
            return
        self._lru[key] = value
        self._lru.move_to_end(key)
        while len(self._lru) > self.max_entries:
            self._lru.popitem(last=False)

    def __len__(self) -> int:
        return len(self._lru)
