"""EngineLike: the in-process Engine, the Ray RemoteEngine and the scripted stand-in all satisfy
it, a public `engine=` that does not is refused, and the actor's optional behaviour hooks are
found by their protocols."""

from __future__ import annotations

import types

import anyio
import pytest

from agentrt import Agent, Engine, EngineConfig, EngineLike, Runtime
from agentrt.engine.like import SessionLike
from agentrt.errors import ConfigError
from agentrt.runtime.actor import Behavior, Forkable, Starts, Stops, Streams
from tests.conftest import tiny_model
from tests.test_pipelined_tools import ScriptedEngine


def test_engines_are_enginelike():
    assert isinstance(Engine(tiny_model(), EngineConfig(kv_cache_tokens=256)), EngineLike)
    assert isinstance(ScriptedEngine([]), EngineLike)
    assert not isinstance(object(), EngineLike)


def test_a_remote_engine_and_its_session_are_enginelike():
    from agentrt.integrations.ray.remote import RemoteEngine, RemoteSession

    remote = RemoteEngine(None, "r", {"model_config": None, "max_context_tokens": 64},
                          types.SimpleNamespace(tokenizer=None))
    assert isinstance(remote, EngineLike)
    assert isinstance(RemoteSession(remote, 1, None), SessionLike)


@pytest.mark.parametrize("engine", ["engine", object(), types.SimpleNamespace(open_session=lambda: None)])
def test_an_agent_refuses_what_is_not_an_engine(engine):
    with pytest.raises(ConfigError, match="engine must be an Engine"):
        Agent("a", engine=engine)


def test_an_agent_is_every_hook_and_forks():
    agent = Agent("a", engine=ScriptedEngine([]))
    for proto in (Behavior, Streams, Starts, Stops, Forkable):
        assert isinstance(agent, proto), proto.__name__


class _Echo:
    """A plain behaviour: handle only (no start, stop or stream hook)."""

    async def handle(self, message, ctx):
        return f"echo {message}"


class _Counter:
    """A streaming-only behaviour with start/stop hooks."""

    def __init__(self) -> None:
        self.started = self.stopped = 0

    async def start(self, ctx) -> None:
        self.started += 1

    async def stop(self, ctx, restarting: bool) -> None:
        self.stopped += 1

    async def stream(self, message, ctx):
        for i in range(int(message)):
            yield i


@pytest.mark.anyio
async def test_optional_hooks_are_found_by_their_protocols():
    counter = _Counter()
    async with Runtime() as rt:
        echo = await rt.spawn(_Echo(), name="echo")
        assert await echo.ask("hi") == "echo hi"
        assert [ev async for ev in echo.ask_stream("x")] == ["echo x"]  # a plain behaviour streams its answer
        ref = await rt.spawn(counter, name="counter")
        assert [ev async for ev in ref.ask_stream(3)] == [0, 1, 2]
        with pytest.raises(ConfigError, match="fork"):
            await rt.fork(echo, name="echo2")
        with pytest.raises(ConfigError, match="handle"):
            await rt.spawn(object())
        await anyio.sleep(0)
    assert (counter.started, counter.stopped) == (1, 1)
