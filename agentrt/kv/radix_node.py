"""A node of the radix tree (kv/radix.py): a run of tokens, whole pages of them, and where their
KV is: pool pages (resident), a tier entry (demoted), or both (promoted, the tier copy kept). Below
both the tree and its tier moves (kv/radix_tier.py), which share it."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentrt.kv.tier import TierEntry


@dataclass(eq=False)
class Node:
    key: list[int] = field(default_factory=list)  # tokens; a whole number of pages
    pages: list[int] = field(default_factory=list)  # pool pages ([] while demoted)
    parent: Node | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)  # by first page
    lock_ref: int = 0
    last_access: int = 0
    tag: str | None = None
    start: int = 0  # token offset of key[0] in the sequence (the node's depth)
    host: TierEntry | None = field(default=None, repr=False)  # the tier copy (demoted, or promoted and kept)
    prefetched: bool = False  # promoted by prefetch and not matched by a request since

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def resident(self) -> bool:
        return bool(self.pages)
