"""Agent-aware eviction (docs/design.md section 3, CacheScout): evict what is used again latest.

Recency is the wrong signal for agents that take turns: with A1 B1 ... H1 A2 B2 ... and too
little KV memory for all histories, the least recently used agent is exactly the one that runs
next, so LRU misses every time. This policy learns who follows whom and evicts the cache whose
agent is predicted to come back last (Belady's rule with a learned future).

- **Transition learner** (`TransitionChain`): `on_request(tag)` is called when a request of an
  agent is admitted; the chain counts tag -> next-tag transitions online. A repeat of the same
  tag (an agent's tool loop) is not a transition, and a None tag (unknown requester) is
  ignored, so A, tool, A, B still teaches A -> B. Memory is bounded: at most `max_tags` tags
  (the least recently seen is forgotten), `max_successors` successors per tag (the rarest is
  dropped), and a tag's counts are halved when they sum past `max_count`, so the chain follows
  a workflow that changes.
- **Survival scoring** (`AgentAwarePolicy.distances`): from the last requested tag, follow the
  most likely successor, without repeats, while its probability is at least
  `min_probability`. A tag reached at step k is predicted to run again in k requests. Candidates
  (radix leaves, idle sessions) are ordered by that distance, farthest first; tags not reached,
  None tags and an unpredictable chain get a distance past every reached tag, and equal
  distances go oldest first, so with no prediction the order is exactly LRU.
- **Rebuild cost is not weighed**: the distance decides and recency breaks ties. A leaf's pages
  are only part of what its agent re-prefills after a miss, so page counts would be a poor
  proxy; the cost of the simpler rule is that a small far leaf goes before a large near one.
- **Cheap**: the distance map is computed once per admitted request (O(tags x successors)) and
  cached; ordering candidates is one sort, O(candidates log candidates).

A leaf's tag is the agent that inserted it: a prefix that several agents share is scored by its
first owner. One policy instance belongs to one engine (it holds that engine's chain).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from agentrt.errors import ConfigError
from agentrt.kv.eviction import EvictableNode, EvictionPolicyBase, N, S

T = TypeVar("T")


class TransitionChain:
    """Online first-order Markov chain over agent tags, with bounded memory."""

    def __init__(self, max_tags: int = 256, max_successors: int = 16, max_count: int = 64):
        if max_tags < 1 or max_successors < 1:
            raise ConfigError("max_tags and max_successors must be >= 1")
        if max_count <= max_successors:
            raise ConfigError(f"max_count ({max_count}) must exceed "
                              f"max_successors ({max_successors})")
        self.max_tags, self.max_successors, self.max_count = max_tags, max_successors, max_count
        self.last: str | None = None  # the tag of the last admitted request
        self._rows: dict[str, dict[str, int]] = {}  # tag -> {next tag: count}
        self._seen: OrderedDict[str, None] = OrderedDict()  # known tags, least recent first

    def __len__(self) -> int:
        return len(self._seen)

    def observe(self, tag: str | None) -> bool:
        """Record that `tag` made a request; returns whether the chain changed."""
        if tag is None or tag == self.last:
            return False
        if self.last is not None:
            self._count(self.last, tag)
        self.last = tag
        self._touch(tag)
        return True

    def successor(self, tag: str) -> tuple[str | None, float]:
        """The most likely next tag after `tag` and its probability ((None, 0.0) if unknown)."""
        row = self._rows.get(tag)
        if not row:
            return None, 0.0
        nxt, c = max(row.items(), key=lambda kv: kv[1])
        return nxt, c / sum(row.values())

    def _count(self, a: str, b: str) -> None:
        row = self._rows.setdefault(a, {})
        if b not in row and len(row) >= self.max_successors:
            del row[min(row, key=row.__getitem__)]
        row[b] = row.get(b, 0) + 1
        if sum(row.values()) > self.max_count:  # decay: ceil-halve, no entry drops to 0
            self._rows[a] = {k: (c + 1) // 2 for k, c in row.items()}

    def _touch(self, tag: str) -> None:
        self._seen[tag] = None
        self._seen.move_to_end(tag)
        if len(self._seen) > self.max_tags:
            old, _ = self._seen.popitem(last=False)
            self._forget(old)

    def _forget(self, tag: str) -> None:
        self._rows.pop(tag, None)
        for row in self._rows.values():
            row.pop(tag, None)

    def check_invariants(self) -> None:
        if len(self._seen) > self.max_tags:
            raise AssertionError("transition chain holds more tags than max_tags")
        if self.last is not None and self.last not in self._seen:
            raise AssertionError("transition chain's last tag is not known")
        for tag, row in self._rows.items():
            if tag not in self._seen or any(k not in self._seen for k in row):
                raise AssertionError("transition chain row names a forgotten tag")
            if len(row) > self.max_successors or sum(row.values()) > self.max_count:
                raise AssertionError("transition chain row exceeds its bounds")
            if any(c < 1 for c in row.values()):
                raise AssertionError("transition chain count below 1")


class AgentAwarePolicy(EvictionPolicyBase):
    """Evicts the cache (radix leaves, idle sessions) whose agent is predicted to run again
    latest; LRU where the learned chain predicts nothing. See the module docstring."""

    name = "agent_aware"

    def __init__(self, *, min_probability: float = 0.5, max_tags: int = 256,
                 max_successors: int = 16, max_count: int = 64):
        if not 0.0 < min_probability <= 1.0:
            raise ConfigError(f"min_probability must be in (0, 1], got {min_probability}")
        self.min_probability = min_probability
        self.chain = TransitionChain(max_tags, max_successors, max_count)
        self._dist: dict[str, int] | None = None  # cached distances; None = stale

    # ---- learner --------------------------------------------------------------------
    def on_request(self, tag: str | None) -> None:
        if self.chain.observe(tag):
            self._dist = None

    def on_insert(self, node: EvictableNode) -> None:
        pass

    def on_access(self, node: EvictableNode) -> None:
        pass

    # ---- scoring --------------------------------------------------------------------
    def distances(self) -> dict[str, int]:
        """Tag -> predicted requests until its next use, along the likeliest chain from the
        last requested tag (which itself appears only if the chain cycles back to it)."""
        if self._dist is None:
            self._dist = self._walk()
        return self._dist

    def _walk(self) -> dict[str, int]:
        dist: dict[str, int] = {}
        cur = self.chain.last
        for k in range(1, 2 * len(self.chain) + 1):
            if cur is None:
                break
            nxt, p = self.chain.successor(cur)
            if nxt is None or p < self.min_probability or nxt in dist:
                break
            dist[nxt], cur = k, nxt
        return dist

    def _order(self, items: list[T], tag: Callable[[T], str | None],
               recency: Callable[[T], int]) -> list[T]:
        dist = self.distances()
        far = len(dist) + 1  # past every predicted use (an untagged item's too)

        def rank(x: T) -> tuple[int, int]:
            t = tag(x)
            return -(far if t is None else dist.get(t, far)), recency(x)

        return sorted(items, key=rank)

    def victim_order(self, leaves: list[N]) -> list[N]:
        """Radix leaves, the first evicted first."""
        return self._order(leaves, lambda n: n.tag, lambda n: n.last_access)

    def order_sessions(self, sessions: list[S]) -> list[S]:
        """Idle sessions, the first detached first."""
        return self._order(sessions, lambda s: s.tag, lambda s: s.last_used)

    def check_invariants(self) -> None:
        self.chain.check_invariants()
        if self._dist is not None and self._dist != self._walk():
            raise AssertionError("agent-aware policy's cached distances are stale")
