"""A session's KV state: the long-lived sequence an agent's turns run on, its history, and the
facts tool-aware retention (kv/retention.py) and the return prefetch (kv/hierarchy.py) keep on it.
The KV room holds the sessions (kv/room.py); a request names the one it runs on
(records/request.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrt.kv.identity import KVSpace, space
from agentrt.kv.kv_manager import Sequence


@dataclass(eq=False)
class EngineSession:
    """A long-lived sequence (from the session region of the pool) that keeps its KV across
    turns. `seq.tokens` is exactly what its KV covers."""

    sid: int
    seq: Sequence
    tag: str | None = None
    cache_salt: str | None = None
    busy: bool = False
    closed: bool = False
    last_used: int = 0
    history: list[int] = field(default_factory=list)  # seq.tokens when its last turn ended
    # tool-aware retention (kv/retention.py): the tools its last turn called, when, and
    # until when (the core clock's now()) its KV is ranked after every unpinned candidate
    tools: tuple[str, ...] = ()
    tools_at: float = 0.0
    pin_until: float = 0.0
    # return prefetch (kv/hierarchy.py::prefetch_returning): pages held before it (-1: none
    # in this wait) and pages it promoted back
    prefetch_from: int = -1
    prefetch_pages: int = 0
    adapter: str | None = None  # the adapter its turns run unless a call names another (its name)
    key: str | None = None  # a stable conversation key: the state store's registry lists its KV under it
    disk_until: int = 0  # its first tokens known to be on the disk tier (kv/disk.py; set by its writer)

    @property
    def space(self) -> str | KVSpace | None:
        """The key its KV is cached under (kv/identity.py: the salt, and its KV's adapter)."""
        return space(self.cache_salt, self.seq.adapted)
