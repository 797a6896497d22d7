"""What a piece of KV is: the one identity every KV structure is keyed by.

Keys and values depend on the tokens, the model's weights, and the LoRA adapter that computed
them; tenants must not share them either. The model is one per engine (its fingerprint,
kv/snapshot.py, guards snapshots and any store outside the process); within the engine a
sequence's KV is described by `Adapted`: the adapter (by content fingerprint, never by name) and
the position it computed from. Positions before `start` are the base model's KV (an activated
LoRA's prefix before its invocation); a plain LoRA starts at 0; the base model has no adapter.

`space(salt, adapted)` is the radix root (and response-cache, prefix-group) key of such KV: the
tenant salt alone for base KV, the salt with the adapter and its start otherwise. An aLoRA
sequence's KV before `start` is base KV: it is matched, and offered back, under the base key
too. Two sequences' KV agree up to `shared_until(held, wanted)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True)
class Adapted:
    """The adapter that computed a sequence's KV from position `start` on (base before it)."""

    fingerprint: str | None = None  # None: the base model's KV throughout
    start: int = 0

    @property
    def base(self) -> bool:
        return self.fingerprint is None


BASE = Adapted()


@dataclass(frozen=True)
class KVSpace:
    """The radix root of KV computed under an adapter (from `start`) for tenant `salt`."""

    salt: str | None
    adapter: str
    start: int = 0


# a radix root's key (and the response cache's, a prefix group's): the tenant salt alone for the
# base model's KV (None: no tenant), a KVSpace for an adapter's
RootKey: TypeAlias = str | KVSpace | None


def space(salt: str | None, adapted: Adapted) -> RootKey:
    """The key KV of this identity is cached under (the salt alone for the base model)."""
    return salt if adapted.fingerprint is None else KVSpace(salt, adapted.fingerprint, adapted.start)


def shared_until(held: Adapted, wanted: Adapted) -> int | None:
    """The first position where KV computed as `held` differs from KV needed as `wanted` (None:
    nowhere: the same identity, so all of the common tokens are reusable)."""
    if held == wanted:
        return None
    starts = [a.start for a in (held, wanted) if not a.base]
    return min(starts)
