"""Placement over simulated replicas (bench/cluster_sim.py): which replica a call goes to, and
when a session moves.

`Router` sees what a cluster's router sees: the calls in flight per replica (counted by the
driver), each replica's prefix cache (`Engine.cached_prefix_len`, a read) and, for
session_affine, where each agent lives.

  * round_robin: in turn; least_loaded: the fewest calls in flight (then the lowest index);
  * prefix_affine: the replica holding the longest cached prefix of the prompt, unless it is
    imbalanced (more than 32 calls in flight over the least loaded and 1.5x it: sglang's and
    vllm's routers' cache_aware rule); no replica holding any of it: the least loaded;
  * session_affine: an agent lives on one replica (placed at its first call on the one with the
    fewest agents, then the fewest calls in flight, as ClusterRuntime places at spawn); a call
    arriving at a replica more than `migrate_gap` calls over the least loaded one moves the
    session there first when the wait it saves beats the transfer (`move_session`).

A move is ClusterRuntime.migrate's snapshot -> restore done in memory (what Session.snapshot and
Engine.restore do, without the file): the session's tokens and KV are exported on the source (in
its step loop), the session closed there, the transfer time (`Overheads.transfer_s`: fixed + per
token, measured by bench_cluster) slept in virtual time, and the KV imported into a new session
on the target, whose next call prefills only what follows. A target without room for it
(OutOfKVMemory) opens an empty session instead: its next call prefills the whole history."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import anyio

from agentrt import Engine
from agentrt.errors import ConfigError, OutOfKVMemory
from agentrt.sim import StepCosts

POLICIES = ("round_robin", "least_loaded", "prefix_affine", "session_affine")
BALANCE_ABS, BALANCE_REL = 32, 1.5  # prefix_affine's imbalance thresholds (cache_aware routing)
DECODE_BATCH = 8  # the batch a waiting call is assumed to decode in (the move-pays estimate)


@dataclass(frozen=True)
class Overheads:
    """What a call and a move cost beyond the replicas' steps (measured by bench_cluster)."""

    call_overhead: float = 0.0  # s a call spends off the replica's steps (driver, RPC, parsing)
    transfer_fixed: float = 0.0  # s per session move, whatever its size
    transfer_per_token: float = 0.0  # s per KV token moved (snapshot -> restore)

    def __post_init__(self) -> None:
        for name in ("call_overhead", "transfer_fixed", "transfer_per_token"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ConfigError(f"Overheads.{name} must be a number >= 0 (seconds), got {v!r}")

    def transfer_s(self, tokens: int) -> float:
        return self.transfer_fixed + self.transfer_per_token * tokens


async def move_session(src: Engine, dst: Engine, session, tag: str | None, transfer_s) -> object:
    """The session's KV from src to a new session on dst (transfer_s(tokens) seconds slept
    between the two); returns the new session."""
    data = await src.run_in_step_thread(lambda: src.core.branching.export(session.engine_session))
    await session.close()
    await anyio.sleep(transfer_s(len(data["tokens"])))
    try:
        return await dst.open_session_with(lambda sid: dst.core.branching.restore(sid, data, tag, None), None)
    except OutOfKVMemory:
        return await dst.open_session(tag=tag)


class Router:
    def __init__(self, policy: str, engines: list[Engine], costs: StepCosts, over: Overheads,
                 migrate_gap: int, output_tokens: int) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy, self.engines, self.costs, self.over = policy, engines, costs, over
        self.migrate_gap, self.output_tokens = migrate_gap, output_tokens
        self.inflight = [0] * len(engines)  # calls in flight per replica (the driver counts them)
        self.home: dict[int, int] = {}  # agent -> its replica (session_affine)
        self.homed = [0] * len(engines)  # agents living on each replica
        self.migrations = 0
        self._turn = itertools.count()

    # ---- transient calls -----------------------------------------------------------
    def least(self) -> int:
        return min(range(len(self.engines)), key=lambda i: (self.inflight[i], i))

    def route(self, prompt: list[int]) -> int:
        """The replica for a call routed on its own (round_robin, least_loaded, prefix_affine)."""
        if self.policy == "round_robin":
            return next(self._turn) % len(self.engines)
        if self.policy == "least_loaded":
            return self.least()
        if self.policy == "prefix_affine":
            return self._prefix_affine(prompt)
        raise ConfigError("session_affine places sessions: use Router.session_for")

    def _prefix_affine(self, prompt: list[int]) -> int:
        cached = [e.cached_prefix_len(prompt) for e in self.engines]
        least = self.least()
        best = max(range(len(self.engines)), key=lambda i: (cached[i], -self.inflight[i], -i))
        if cached[best] == 0:
            return least
        busy, idle = self.inflight[best], self.inflight[least]
        return least if busy - idle > BALANCE_ABS and busy > BALANCE_REL * idle else best

    # ---- sessions --------------------------------------------------------------------
    async def session_for(self, agent: int, session, tag: str, context: int) -> tuple[int, object]:
        """(replica, session) for the agent's next call: opened at its first call, moved when
        its replica is overloaded and the move pays."""
        if session is None:
            home = min(range(len(self.engines)), key=lambda i: (self.homed[i], self.inflight[i], i))
            self.home[agent] = home
            self.homed[home] += 1
            return home, await self.engines[home].open_session(tag=tag)
        home, least = self.home[agent], self.least()
        gap = self.inflight[home] - self.inflight[least]
        if home == least or gap <= self.migrate_gap or not self._move_pays(len(session.tokens), gap, context):
            return home, session
        moved = await move_session(self.engines[home], self.engines[least], session, tag, self.over.transfer_s)
        self.home[agent] = least
        self.homed[home] -= 1
        self.homed[least] += 1
        self.migrations += 1
        return least, moved

    def _move_pays(self, tokens: int, gap: int, context: int) -> bool:
        """The move beats waiting behind `gap` calls' decodes (batches of up to DECODE_BATCH)."""
        b = min(gap, DECODE_BATCH)
        step = self.costs.seconds([(context, 1)] * b)
        return self.over.transfer_s(tokens) < gap * self.output_tokens * step / b
