"""`ClusterRuntime`: the `Runtime` API over engine replicas that are Ray actors.

    async with ClusterRuntime(ModelSpec("smollm2-135m"), replicas=2) as rt:
        ref = await rt.spawn(Agent("weather", "...", [get_weather], tool_choice="required"))
        result = await rt.ask(ref, "What is the weather in Paris?")

Each agent actor runs here, in the driver (its tools run in this process), and generates on the
replica its placement policy chose (`placement.py`) through a `RemoteEngine`; it stays there for
its life. Its conversation (messages and token ids) lives here; the replica holds its KV.

  * **Migration** (`migrate`, `rebalance`, `drain`): an idle agent's session is snapshotted on its
    replica, the bytes restored on the target and the agent rebound to it; its next turn
    prefills only what is new, and decodes the same tokens.
  * **Failover**: a replica that dies fails the turn in flight with `ReplicaLost`; `ask` then rewinds
    the conversation to before that turn and moves the replica's agents to live replicas, restored
    from their last snapshot (`checkpoint_turns=True`: one after every turn) or re-prefilled from
    the history the driver holds. Asking again continues the conversation; nothing is lost.

Ask through the cluster (`rt.ask` / `rt.ask_stream`): it serializes an agent's turns with its
moves and handles failover. Leaving the block stops the agents, then every replica actor (and Ray,
when this runtime started it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio

from agentrt.checks import check_int
from agentrt.conversation.chat_format import build_chat_format
from agentrt.errors import ActorStopped, ConfigError, ReplicaLost
from agentrt.runtime.agent import Agent
from agentrt.runtime.runtime import Runtime

from .placement import AgentInfo, Policy, ReplicaView, make_policy, prefix_key
from .remote import RemoteEngine, RemoteSession
from .replica import EngineReplica, ModelSpec


class ClusterRuntime(Runtime):
    """`replicas` engine replicas of `model` (a ModelSpec), `cpus_per_replica` Ray CPUs and
    `threads_per_replica` torch threads each; `placement` a policy name or callable."""

    def __init__(self, model: ModelSpec, *, replicas: int = 2, engine_config: Any = None,
                 placement: str | Policy = "session_affine", threads_per_replica: int = 1,
                 cpus_per_replica: float = 0.5, checkpoint_turns: bool = False, ray_init: dict | None = None,
                 **runtime_kw: Any) -> None:
        super().__init__(None, **runtime_kw)
        if not isinstance(model, ModelSpec):
            raise ConfigError(f"model must be a ModelSpec (ModelSpec('smollm2-135m')), got {type(model).__name__}")
        self.spec, self.engine_config = model, engine_config
        self.n_replicas = check_int("replicas", replicas, min=1)
        self.policy = make_policy(placement)
        self.threads, self.cpus, self.checkpoint_turns = threads_per_replica, cpus_per_replica, checkpoint_turns
        self._ray_init = ray_init or {}
        self._owns_ray = False
        self.replicas: list[RemoteEngine] = []
        self.where: dict[str, int] = {}  # agent name -> replica index
        self._prefixes: dict[str, str] = {}  # agent name -> key of its static prefix (instructions + tools)
        self._loads: dict[int, dict] = {}
        self._draining: set[int] = set()
        self._snapshots: dict[str, bytes] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self.moves: list[tuple[str, int, int, str]] = []  # (agent, from, to, why)
        self.engines: dict[str, int] = {}  # engine_for() names -> replica index
        self._portal: Any = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> "ClusterRuntime":
        import ray

        if not ray.is_initialized():
            ray.init(**{"include_dashboard": False, "log_to_driver": False, **self._ray_init})
            self._owns_ray = True
        actor = ray.remote(EngineReplica)
        # (Ray actor handles: their methods gain `.remote` at run time, which ray's typing does not model)
        handles: list[Any] = [actor.options(num_cpus=self.cpus, max_concurrency=1000).remote(
            self.spec, self.engine_config, self.threads, f"replica-{i}") for i in range(self.n_replicas)]
        infos = await asyncio.gather(*(h.start.remote() for h in handles))
        tokenizer = await handles[0].tokenizer.remote()
        chat = build_chat_format(tokenizer, self.engine_config)
        self._portal = anyio.from_thread.BlockingPortal()  # (for ChatAgentrt's sync calls from other threads)
        portal = await self._portal.__aenter__()
        loop_thread = threading.get_ident()
        self.replicas = [RemoteEngine(h, f"replica-{i}", info, chat, self.engine_config, portal, loop_thread)
                         for i, (h, info) in enumerate(zip(handles, infos))]
        await super().__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        import ray

        try:
            await super().__aexit__(*exc)
        finally:
            for r in self.replicas:
                if r.alive:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(r.handle.shutdown.remote(), 30)
                ray.kill(r.handle, no_restart=True)
                r.alive = False
            for r in self.replicas:  # (ray.kill returns before the actor is gone)
                await _gone(r.handle)
            if self._owns_ray:
                ray.shutdown()
            if self._portal is not None:
                await self._portal.__aexit__(None, None, None)

    async def load_adapter(self, name: str, path: Any, dtype: str | None = None) -> list[Any]:
        """Load a LoRA adapter on every live replica (agents may land or move anywhere); each
        replica's AdapterInfo."""
        return list(await asyncio.gather(*(r.load_adapter(name, path, dtype) for r in self.replicas if r.alive)))

    async def unload_adapter(self, name: str) -> None:
        await asyncio.gather(*(r.unload_adapter(name) for r in self.replicas if r.alive))

    # ---- placement -----------------------------------------------------------------------
    async def spawn(self, behavior: Any, *, name: str | None = None, replica: int | None = None, **kw: Any):
        """Start an agent on `replica` (default: the placement policy's choice)."""
        if not isinstance(behavior, Agent):
            raise ConfigError(f"ClusterRuntime.spawn takes an Agent, got {type(behavior).__name__}")
        if behavior.engine is not None:
            raise ConfigError(f"agent {behavior.name!r} has an engine already; the cluster gives it a replica")
        name = name or behavior.name
        self._prefixes[name] = prefix_key(behavior.spec.instructions, behavior.spec.tool_schemas())
        idx = await self._place(name) if replica is None else self._check_replica(replica)
        behavior.engine = self.replicas[idx]
        self.where[name] = idx
        self._locks[name] = anyio.Lock()
        return await super().spawn(behavior, name=name, **kw)

    async def engine_for(self, name: str) -> RemoteEngine:
        """A replica for a client that is not an agent of this runtime -- `ChatAgentrt(engine=...)`
        for a LangGraph graph, say -- placed by the policy once per name (its sessions live there)."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"engine_for takes a non-empty name, got {name!r}")
        if name not in self.engines:
            await self.refresh()
            self.engines[name] = self.policy(AgentInfo(name), [v for v in self.views() if v.index not in self._draining])
        return self.replicas[self.engines[name]]

    def _check_replica(self, idx: Any) -> int:
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(self.replicas):
            raise ConfigError(f"replica must be an index in 0..{len(self.replicas) - 1}, got {idx!r}")
        if not self.replicas[idx].alive:
            raise ReplicaLost(f"replica {idx} is not alive")
        return idx

    async def _place(self, name: str, exclude: frozenset[int] = frozenset()) -> int:
        await self.refresh()
        info = AgentInfo(name, self._prefixes.get(name, ""))
        views = [v for v in self.views() if v.index not in exclude and v.index not in self._draining]
        if not any(v.alive for v in views):
            views = [v for v in self.views() if v.index not in exclude]
        return self.policy(info, views)

    def views(self) -> list[ReplicaView]:
        views = [ReplicaView(i, r.alive, self._loads.get(i, {}).get("kv_occupancy", 0.0),
                             self._loads.get(i, {}).get("waiting", 0) + self._loads.get(i, {}).get("running", 0))
                 for i, r in enumerate(self.replicas)]
        for idx in self.engines.values():
            views[idx].agents += 1
        for name, idx in self.where.items():
            views[idx].agents += 1
            key = self._prefixes[name]
            views[idx].prefixes[key] = views[idx].prefixes.get(key, 0) + 1
        return views

    async def refresh(self) -> dict[int, dict]:
        """Read every live replica's load (KV occupancy, queue, sessions); a dead one is marked."""
        for i, r in enumerate(self.replicas):
            if r.alive:
                with contextlib.suppress(ReplicaLost):
                    self._loads[i] = await r.load()
        return dict(self._loads)

    def _behavior(self, name: str) -> Agent | None:
        ref = self.actors.get(name)
        return ref.behavior if ref is not None and isinstance(ref.behavior, Agent) else None

    def _agent(self, name: str) -> Agent:
        """The agent `name` runs (ActorStopped when it no longer does)."""
        behavior = self._behavior(name)
        if behavior is None:
            raise ActorStopped(f"agent {name!r} is not running on this cluster (stopped); spawn it again")
        return behavior

    # ---- turns -----------------------------------------------------------------------------
    async def ask(self, agent: Any, message: Any, *, timeout: float | None = None) -> Any:
        """The agent's answer; ReplicaLost if its replica died meanwhile (asking again continues)."""
        name = agent if isinstance(agent, str) else agent.name
        async with self._turn(name) as behavior:
            result = await self.get(name).ask(message, timeout=timeout)
            await self._checkpoint(name, behavior)
            return result

    async def ask_stream(self, agent: Any, message: Any) -> AsyncIterator[Any]:
        name = agent if isinstance(agent, str) else agent.name
        async with self._turn(name) as behavior:
            async for ev in self.get(name).ask_stream(message):
                yield ev
            await self._checkpoint(name, behavior)

    @contextlib.asynccontextmanager
    async def _turn(self, name: str):
        if name not in self._locks:
            raise ConfigError(f"no agent named {name!r} runs on this cluster")
        async with self._locks[name]:
            behavior = self._behavior(name)
            if behavior is None or self.actors[name].stopped:
                raise ActorStopped(f"agent {name!r} is not running on this cluster (stopped); spawn it again")
            if not self.replicas[self.where[name]].alive:
                await self._recover(name, "failover")
            mark = behavior.mark() if behavior.conversation is not None else None
            try:
                yield behavior
            except ReplicaLost:
                if mark is not None:
                    behavior.rewind(mark)  # the lost turn leaves nothing behind
                await self._recover(name, "failover")
                raise

    async def failover(self) -> list[str]:
        """Move now every agent whose replica died (otherwise each moves at its next turn)."""
        moved = []
        for name in [n for n, i in list(self.where.items()) if not self.replicas[i].alive]:
            async with self._locks[name]:
                await self._recover(name, "failover")
            moved.append(name)
        return moved

    async def _checkpoint(self, name: str, behavior: Agent) -> None:
        if self.checkpoint_turns and isinstance(behavior.session, RemoteSession):
            self._snapshots[name] = await behavior.session.snapshot_bytes()

    # ---- moves -----------------------------------------------------------------------------
    async def migrate(self, agent: Any, to: int | None = None, *, why: str = "migrate") -> int:
        """Move an agent's session to replica `to` (default: the policy's choice among the others):
        snapshot -> transfer -> restore; returns the replica it is on now."""
        name = agent if isinstance(agent, str) else agent.name
        async with self._locks[name]:
            return await self._move(name, to, why)

    async def _move(self, name: str, to: int | None, why: str) -> int:
        behavior, src = self._agent(name), self.where[name]
        dst = self._check_replica(to) if to is not None else await self._place(name, frozenset({src}))
        if dst == src:
            return src
        old = behavior.session
        if not isinstance(old, RemoteSession):  # passivated: its next turn opens a session there
            self._rebind(name, behavior, dst, None, why)
            return dst
        session = await self.replicas[dst].restore_bytes(await old.snapshot_bytes(), tag=name)
        self._rebind(name, behavior, dst, session, why)
        await old.close()
        return dst

    async def _recover(self, name: str, why: str) -> int:
        """Place an agent whose replica died on a live one: its last snapshot, or its history."""
        behavior, src = self._agent(name), self.where[name]
        if self.replicas[src].alive:
            return src
        dst = await self._place(name, frozenset({src}))
        remote = self.replicas[dst]
        data = self._snapshots.get(name)
        session = await remote.restore_bytes(data, tag=name) if data else await remote.open_session(tag=name)
        self._rebind(name, behavior, dst, session, why)
        return dst

    def _rebind(self, name: str, behavior: Agent, dst: int, session: RemoteSession | None,
                why: str = "migrate") -> None:
        self.moves.append((name, self.where[name], dst, why))
        behavior.engine = self.replicas[dst]
        behavior.session = session
        if behavior.conversation is not None:
            behavior.conversation.engine, behavior.conversation.session = self.replicas[dst], session
        self.where[name] = dst

    async def drain(self, replica: int) -> list[str]:
        """Move every agent off `replica` (idle ones at once; busy ones after their turn) and place
        no new agent there; returns the agents moved."""
        self._check_replica(replica)
        self._draining.add(replica)
        moved = [n for n, i in list(self.where.items()) if i == replica]
        for name in moved:
            await self.migrate(name, why="drain")
        return moved

    async def rebalance(self, high: float = 0.85, target: float = 0.6) -> list[tuple[str, int, int]]:
        """Move idle agents off replicas whose KV occupancy is over `high` to the least loaded one
        while it stays under `target`; returns the moves."""
        out = []
        loads = await self.refresh()
        for src, load in sorted(loads.items(), key=lambda kv: -kv[1]["kv_occupancy"]):
            if load["kv_occupancy"] <= high:
                continue
            for name in [n for n, i in self.where.items() if i == src and not self._locks[n].locked()]:
                dst = await self._place(name, frozenset({src}))
                if loads.get(dst, {}).get("kv_occupancy", 1.0) >= target:
                    break
                await self.migrate(name, dst, why="rebalance")
                out.append((name, src, dst))
                loads = await self.refresh()
                if loads[src]["kv_occupancy"] <= high:
                    break
        return out


async def _gone(handle: Any, timeout: float = 30.0) -> None:
    """Wait until a killed actor answers no more."""
    import ray

    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        try:
            await asyncio.wait_for(handle.ping.remote(), 5)
        except (ray.exceptions.RayActorError, asyncio.TimeoutError):
            return
        await asyncio.sleep(0.05)
