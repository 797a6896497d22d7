"""ClusterRuntime on a local Ray cluster started here: 2-3 replicas of a tiny random model (on the
batch-invariant default path: int8 weights, float16 KV; the replicas' tokens cannot depend on how
their batches or threads differ from the oracle's).

Oracle: the same agents on one local Engine (`Runtime`), token for token. Checked: agents stay on
their replica; a forced migration keeps the next turn's tokens identical and prefills only the
new messages; killing a replica mid-run loses no conversation (the turn in flight fails with
ReplicaLost, asking again gives the single engine's answer); leaving the runtime leaves no
replica actor alive; the replicas' invariants hold.
"""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

ray = pytest.importorskip("ray")

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool  # noqa: E402
from agentrt.errors import ReplicaLost  # noqa: E402
from agentrt.integrations.ray import ClusterRuntime, ModelSpec  # noqa: E402
from agentrt.integrations.ray.cluster import _gone  # noqa: E402
from tests.conftest import tiny_native_with_tokenizer  # noqa: E402

pytestmark = [pytest.mark.slow]

CONFIG = EngineConfig(kv_cache_tokens=4096, response_cache_size=0)
SPEC = ModelSpec(factory=tiny_native_with_tokenizer)
QUESTIONS = ["What is the weather in Paris?", "And in Tokyo?", "And in Oslo?"]


def agents(n: int, on_call=None) -> list[Agent]:
    """n agents with one tool; the tool awaits on_call() first (a test kills a replica there: the
    turn's next round then finds its replica gone)."""
    @tool
    async def get_weather(city: Literal["Paris", "Tokyo", "Oslo"]) -> dict:
        """Current weather for a city.

        Args:
            city: the city name (an enum: the random model's call stays short)
        """
        if on_call is not None:
            await on_call()
        return {"city": city, "temperature_c": 10 + len(city)}

    settings = SamplingParams(max_tokens=40)
    return [Agent(f"a{i}", f"You are agent {i}. Use the tools.", [get_weather], tool_choice="required",
                  max_tool_rounds=1, settings=settings) for i in range(n)]


@pytest.fixture(scope="module")
def oracle():
    """Every agent's turns on one local engine: [agent][turn] -> (tokens held, answer messages)."""
    async def main():
        out = []
        async with Engine(tiny_native_with_tokenizer(), CONFIG) as engine, Runtime(engine) as rt:
            for agent in agents(3):
                ref = await rt.spawn(agent)
                turns = []
                for q in QUESTIONS:
                    result = await ref.ask(q, timeout=120)
                    turns.append((list(agent.tokens), result.messages))
                out.append(turns)
        return out
    return anyio.run(main)


def cluster(**kw) -> ClusterRuntime:
    return ClusterRuntime(SPEC, engine_config=CONFIG, cpus_per_replica=0.5, **kw)


def test_agents_stay_on_their_replica_and_match_one_engine(local_ray, oracle):
    async def main():
        async with cluster(replicas=2) as rt:
            refs = [await rt.spawn(a) for a in agents(3)]
            placed = dict(rt.where)
            assert sorted(set(placed.values())) == [0, 1]  # least loaded at spawn: both used
            for t, q in enumerate(QUESTIONS):
                for i, ref in enumerate(refs):
                    result = await rt.ask(ref, q, timeout=120)
                    assert (list(ref.behavior.tokens), result.messages) == oracle[i][t]
            assert rt.where == placed and rt.moves == []
            for r in rt.replicas:
                await r.call("check")
            handles = [r.handle for r in rt.replicas]
        for h in handles:  # leaving the runtime stops every replica actor
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(h.ping.remote(), timeout=30)
    anyio.run(main)


def test_forced_migration_keeps_tokens_and_prefills_the_delta(local_ray, oracle):
    async def main():
        async with cluster(replicas=2) as rt:
            ref = await rt.spawn(agents(1)[0], replica=0)
            first = await rt.ask(ref, QUESTIONS[0], timeout=120)
            held = list(ref.behavior.tokens)
            kv = await ref.behavior.session.tokens()  # (all but the reply's closing tokens)
            assert kv == held[:len(kv)] and len(held) - len(kv) <= 4
            assert await rt.migrate(ref, 1) == 1 and rt.where["a0"] == 1
            assert await ref.behavior.session.tokens() == kv  # the KV moved, not recomputed
            second = await rt.ask(ref, QUESTIONS[1], timeout=120)
            assert (held, first.messages) == oracle[0][0]
            assert (list(ref.behavior.tokens), second.messages) == oracle[0][1]
            usage = second.usage[0]
            assert usage.cached_tokens == len(kv)  # the restored KV served everything it held
            assert usage.computed_prompt_tokens == usage.prompt_tokens - len(kv)  # only the delta
            assert (await rt.replicas[0].load())["sessions"] == 0  # the old session was closed
            assert await rt.drain(1) == ["a0"] and rt.where["a0"] == 0  # draining moves it back
            third = await rt.ask(ref, QUESTIONS[2], timeout=120)
            assert (list(ref.behavior.tokens), third.messages) == oracle[0][2]
            assert [why for *_, why in rt.moves] == ["migrate", "drain"]
            assert await rt.spawn(agents(2)[1]) is not None and rt.where["a1"] == 0  # none placed on a drained one
            for r in rt.replicas:
                await r.call("check")
    anyio.run(main)


@pytest.mark.parametrize("checkpoint", [True, False], ids=["from_snapshot", "from_history"])
def test_killing_a_replica_mid_turn_loses_no_conversation(local_ray, oracle, checkpoint):
    async def main():
        async with cluster(replicas=3, checkpoint_turns=checkpoint) as rt:
            armed: list[int] = []  # a replica to kill from inside the next tool call

            async def kill_armed():
                if armed:
                    handle = rt.replicas[armed.pop()].handle
                    ray.kill(handle, no_restart=True)
                    await _gone(handle)
            refs = [await rt.spawn(a, replica=i) for i, a in enumerate(agents(3, on_call=kill_armed))]
            for i, ref in enumerate(refs):
                assert ((await rt.ask(ref, QUESTIONS[0], timeout=120)).messages) == oracle[i][0][1]
            victim = rt.where["a1"]
            armed.append(victim)  # a1's next tool call kills its replica: the turn is in flight
            with pytest.raises(ReplicaLost):
                await rt.ask(refs[1], QUESTIONS[1], timeout=120)
            assert rt.where["a1"] != victim and not rt.replicas[victim].alive
            assert [m for *m, why in rt.moves if why == "failover"] == [["a1", victim, rt.where["a1"]]]
            for t in (1, 2):  # asking again continues every conversation, as on one engine
                for i, ref in enumerate(refs):
                    result = await rt.ask(ref, QUESTIONS[t], timeout=120)
                    assert (list(ref.behavior.tokens), result.messages) == oracle[i][t]
            for i in set(rt.where.values()):
                await rt.replicas[i].call("check")
    anyio.run(main)


def test_rebalance_moves_idle_agents_off_a_full_replica(local_ray, oracle):
    async def main():
        async with cluster(replicas=2) as rt:
            refs = [await rt.spawn(a, replica=0) for a in agents(3)]
            for i, ref in enumerate(refs):
                await rt.ask(ref, QUESTIONS[0], timeout=120)
            full = (await rt.refresh())[0]["kv_occupancy"]
            assert full > 0 and (await rt.refresh())[1]["kv_occupancy"] == 0
            moves = await rt.rebalance(high=full * 0.9, target=full)  # replica 0 is "over" by fiat
            assert moves and all(src == 0 and dst == 1 for _, src, dst in moves)
            assert (await rt.refresh())[0]["kv_occupancy"] <= full * 0.9
            for i, ref in enumerate(refs):  # moved or not, every agent goes on as on one engine
                result = await rt.ask(ref, QUESTIONS[1], timeout=120)
                assert (list(ref.behavior.tokens), result.messages) == oracle[i][1]
    anyio.run(main)


def test_bad_arguments_are_typed_errors(local_ray):
    from agentrt.errors import ConfigError

    with pytest.raises(ConfigError, match="ModelSpec"):
        ClusterRuntime("smollm2-135m")
    with pytest.raises(ConfigError, match="replicas"):
        cluster(replicas=0)
    with pytest.raises(ConfigError, match="placement"):
        cluster(placement="random")
    with pytest.raises(ConfigError, match="source"):
        ModelSpec()


def test_chat_model_on_a_replica_matches_a_local_engine(local_ray):
    """ChatAgentrt (the LangGraph adapter) on `engine_for(...)`: a thread's two calls give the
    local engine's messages, and the second prefills only its new messages on the replica."""
    from langchain_core.messages import HumanMessage

    from agentrt.integrations.langgraph import ChatAgentrt

    thread = {"configurable": {"thread_id": "t1"}}

    async def calls(engine, sync: bool) -> list:
        model = ChatAgentrt(engine=engine, max_tokens=16)
        first = [HumanMessage("Hello there.")]
        a = await model.ainvoke(first, thread)
        history = [*first, a, HumanMessage("And again?")]
        b = await (anyio.to_thread.run_sync(lambda: model.invoke(history, thread)) if sync else
                   model.ainvoke(history, thread))
        return [(m.content, m.usage_metadata["input_tokens"]) for m in (a, b)], b.usage_metadata

    async def main():
        async with Engine(tiny_native_with_tokenizer(), CONFIG) as engine:
            want, _ = await calls(engine, sync=False)
        async with cluster(replicas=2) as rt:
            remote = await rt.engine_for("graph")
            assert await rt.engine_for("graph") is remote  # placed once per name
            got, usage = await calls(remote, sync=True)  # (the sync call crosses the cluster's portal)
            assert got == want
            assert usage["input_token_details"]["cache_read"] > 0  # the thread's session held its history
    anyio.run(main)
