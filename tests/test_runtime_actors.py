"""Actor runtime: mailboxes, ask/tell, streaming ask, cancel, supervision, lazy activation."""

from __future__ import annotations

from typing import Literal

import anyio
import pytest

from agentrt.errors import ActorStopped, AskTimeout, MailboxFull, RequestCancelled
from agentrt.runtime.runtime import Runtime
from agentrt.runtime.supervision import Supervision


class Echo:
    def __init__(self):
        self.starts, self.stops, self.seen = 0, 0, []

    async def start(self, ctx):
        self.starts += 1

    async def stop(self, ctx, restarting):
        self.stops += 1

    async def handle(self, msg, ctx):
        if msg == "boom":
            raise ValueError("boom")
        if msg == "slow":
            await anyio.sleep(10)
        self.seen.append(msg)
        return f"echo:{msg}"

    async def stream(self, msg, ctx):
        for ch in msg:
            yield ch


def run(fn):
    async def main():
        async with Runtime() as rt:
            await fn(rt)
    anyio.run(main)


def test_ask_tell_and_one_message_at_a_time():
    async def fn(rt):
        b = Echo()
        ref = await rt.spawn(b, name="e")
        await ref.tell("a")
        assert await ref.ask("b") == "echo:b"
        assert b.seen == ["a", "b"]
        assert [x async for x in ref.ask_stream("xyz")] == ["x", "y", "z"]
    run(fn)


def test_tell_nowait_raises_mailbox_full_and_stop_fails_pending():
    async def fn(rt):
        ref = await rt.spawn(Echo(), name="e", mailbox_size=1)
        async def slow():
            with pytest.raises(RequestCancelled):
                await ref.ask("slow")
        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await anyio.sleep(0.05)  # "slow" is being handled; the mailbox is empty
            ref.tell_nowait("x")
            with pytest.raises(MailboxFull):
                ref.tell_nowait("y")
            ref.cancel()
        await ref.stop()
        with pytest.raises(ActorStopped):
            await ref.tell("late")
    run(fn)


def test_ask_timeout_cancels_the_message_and_actor_goes_on():
    async def fn(rt):
        ref = await rt.spawn(Echo(), name="e")
        with pytest.raises(AskTimeout):
            await ref.ask("slow", timeout=0.05)
        assert await ref.ask("next", timeout=5) == "echo:next"
    run(fn)


def test_cancel_current_message():
    async def fn(rt):
        ref = await rt.spawn(Echo(), name="e")
        async with anyio.create_task_group() as tg:
            async def asker():
                with pytest.raises(RequestCancelled):
                    await ref.ask("slow")
            tg.start_soon(asker)
            await anyio.sleep(0.05)
            ref.cancel()
        assert await ref.ask("after") == "echo:after"
    run(fn)


def test_supervision_restarts_within_limits_then_stops():
    async def fn(rt):
        b = Echo()
        ref = await rt.spawn(b, name="e", supervision=Supervision(max_restarts=2, window_s=60))
        for _ in range(2):
            with pytest.raises(ValueError):
                await ref.ask("boom")
            assert await ref.ask("ok") == "echo:ok"
        with pytest.raises(ValueError):
            await ref.ask("boom")
        await ref.join()
        assert ref.stopped and b.starts == 3 and b.stops == 3
        with pytest.raises(ActorStopped):
            await ref.ask("x")
    run(fn)


def test_lazy_activation_by_kind_and_key():
    async def fn(rt):
        made = []

        def factory(key):
            made.append(key)
            return Echo()
        a1 = await rt.actor("echo", "k1", factory)
        a2 = await rt.actor("echo", "k1", factory)
        b = await rt.actor("echo", "k2", factory)
        assert a1 is a2 and a1 is not b and made == ["k1", "k2"]
    run(fn)


class Asker:
    """Asks the actors named in the message, in turn (the rest of the list goes along)."""

    async def handle(self, msg, ctx):
        if not msg:
            return "done"
        return await ctx.runtime.get(msg[0]).ask(msg[1:], timeout=5)


def test_reentrant_asks_are_refused_at_once_not_deadlocked():
    """An actor asking itself, or A -> B -> A, raises AskCycle immediately (named path); a chain
    without a cycle (A -> B -> C) and a later ask of A still work."""
    from agentrt.errors import AskCycle

    async def body(rt):
        for name in "abc":
            await rt.spawn(Asker(), name=name)
        a = rt.get("a")
        with anyio.fail_after(3):  # (a deadlock would wait for the 5 s timeouts)
            with pytest.raises(AskCycle, match="a -> a"):
                await a.ask(["a"])
            with pytest.raises(AskCycle, match="a -> b -> a"):
                await a.ask(["b", "a"])
            assert await a.ask(["b", "c"]) == "done"
            assert await a.ask([]) == "done"
    run(body)


def test_an_agent_whose_tool_asks_that_agent_gets_a_tool_error_not_a_deadlock():
    """The chain of asks travels into the agent's tool calls: a tool asking its own agent is
    refused with AskCycle at once, which the model reads as the tool's error; the turn ends and
    the agent answers the next ask (tiny model, tool_choice required)."""
    from agentrt import Agent, Engine, EngineConfig, SamplingParams, tool
    from tests.conftest import tiny_native_with_tokenizer

    holder: dict = {}

    @tool
    async def ask_back(question: Literal["why"]) -> str:
        """Ask the agent that called this tool."""
        return await holder["ref"].ask(question, timeout=30)

    async def main():
        async with Engine(tiny_native_with_tokenizer(), EngineConfig(kv_cache_tokens=4096)) as eng, \
                Runtime(eng) as rt:
            holder["ref"] = ref = await rt.spawn(Agent("a", "Call ask_back.", [ask_back], tool_choice="required",
                                                       max_tool_rounds=1, settings=SamplingParams(max_tokens=48)))
            with anyio.fail_after(20):  # (a deadlock would wait for the tool's 30 s timeout)
                result = await ref.ask("go")
                again = await ref.ask("go again")
            return result, again

    result, again = anyio.run(main)
    assert result.tool_results and all(r.is_error and "AskCycle" in r.content for r in result.tool_results)
    assert "a -> a" in result.tool_results[0].content
    assert again.rounds >= 1


def test_a_crash_on_a_failed_engine_is_not_restarted():
    """EngineFailed (and EngineClosed) cannot be fixed by a restart: the actor stops at once,
    its stop told it is not restarting, instead of backing off through its restart budget."""
    from agentrt.errors import EngineFailed

    class Dead(Echo):
        async def stop(self, ctx, restarting):
            self.stops += 1
            self.restarting = restarting

        async def handle(self, msg, ctx):
            raise EngineFailed("the engine's step thread stopped")

    async def fn(rt):
        b = Dead()
        ref = await rt.spawn(b, name="d", supervision=Supervision(max_restarts=5, window_s=60, backoff_s=1.0))
        with pytest.raises(EngineFailed):
            await ref.ask("x")
        with anyio.fail_after(0.5):  # (a restart would first sleep backoff_s)
            await ref.join()
        assert b.starts == 1 and b.stops == 1 and b.restarting is False
    run(fn)
