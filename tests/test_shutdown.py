"""Bounded shutdown: leaving `async with Runtime(...)` returns within `shutdown_timeout` even when
a tool never returns (an async tool sleeping for ever, a sync tool blocked in its worker thread),
the askers get ActorStopped instead of hanging, and no KV page or sequence id leaks."""

from __future__ import annotations

import math
import threading
import time

import anyio
import pytest

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.errors import ActorStopped, ConfigError
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.runtime import DEFAULT_SHUTDOWN_TIMEOUT, Runtime
from agentrt.tools import tool
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

BOUND = 0.5


@pytest.mark.parametrize("bad", [-1, float("nan"), "5", True, None])
def test_shutdown_timeout_rejects_bad_values(bad):
    with pytest.raises(ConfigError, match="shutdown_timeout"):
        Runtime(shutdown_timeout=bad)


def test_shutdown_timeout_default_and_inf():
    assert Runtime().shutdown_timeout == DEFAULT_SHUTDOWN_TIMEOUT
    assert Runtime(shutdown_timeout=math.inf).shutdown_timeout == math.inf


class Forever:
    def __init__(self):
        self.stopped = False

    async def handle(self, msg, ctx):
        await anyio.sleep_forever()

    async def stop(self, ctx, restarting):
        self.stopped = True


def test_handler_that_never_returns_does_not_block_shutdown():
    outcome = {}

    async def main():
        b = Forever()
        async with anyio.create_task_group() as callers:
            async with Runtime(shutdown_timeout=BOUND) as rt:
                ref = await rt.spawn(b, name="forever")

                async def ask():
                    with pytest.raises(ActorStopped):
                        await ref.ask("x")
                    outcome["asked"] = True

                callers.start_soon(ask)
                await anyio.sleep(0.05)
                t0 = time.monotonic()
            outcome["elapsed"] = time.monotonic() - t0
        assert b.stopped and ref.stopped

    anyio.run(main)
    assert outcome["asked"]
    assert BOUND * 0.8 <= outcome["elapsed"] < BOUND + 1.0, outcome


def test_tool_that_never_returns_does_not_block_shutdown_or_leak_kv():
    """One agent's async tool sleeps for ever, another's sync tool blocks its worker thread."""
    lm = tiny_model_with_tokenizer()
    release = threading.Event()
    started = {"hang": threading.Event(), "block": threading.Event()}

    @tool  # no timeout
    async def hang(go: bool) -> str:
        """Never returns.

        Args:
            go: anything
        """
        started["hang"].set()
        await anyio.sleep_forever()

    @tool  # no timeout; a thread cannot be cancelled, only abandoned
    def block(go: bool) -> str:
        """Blocks its thread.

        Args:
            go: anything
        """
        started["block"].set()
        release.wait(30)
        return "late"

    outcome: dict = {"stopped": []}
    cfg = EngineConfig(kv_cache_tokens=8192, max_session_seqs=4, debug_invariants=True)

    async def main():
        async with Engine(lm, cfg) as eng:
            async with anyio.create_task_group() as callers:
                async with Runtime(eng, shutdown_timeout=BOUND) as rt:
                    for name, fn in (("hang", hang), ("block", block)):
                        ref = await rt.spawn(Agent(name, "Call the tool.", [fn], tool_choice="required",
                                                   settings=GenerationSettings(max_tokens=48), max_tool_rounds=1),
                                             name=name)

                        async def ask(ref=ref):
                            try:
                                await ref.ask("go")
                            except ActorStopped:
                                outcome["stopped"].append(ref.name)

                        callers.start_soon(ask)
                    with anyio.fail_after(60):
                        while not all(e.is_set() for e in started.values()):
                            await anyio.sleep(0.01)
                    t0 = time.monotonic()
                outcome["elapsed"] = time.monotonic() - t0
            # the cancelled requests' last commands may still be in the step thread's inbox
            with anyio.fail_after(5):
                while True:
                    try:
                        eng.stats()  # a round trip through the step lock
                        assert_quiescent(eng.core)
                        break
                    except AssertionError:
                        await anyio.sleep(0.01)
            core = eng.core
            assert not core.sessions
            assert core.pool.num_free("session") == cfg.max_session_seqs
            core.check_invariants()

    try:
        anyio.run(main)
    finally:
        release.set()
    assert sorted(outcome["stopped"]) == ["block", "hang"]
    assert outcome["elapsed"] < BOUND + 1.5, outcome
