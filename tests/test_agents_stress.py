"""16 agents x 5 turns concurrently on a tiny model: flaky tools, timeouts and random
cancellations; the runtime keeps serving and nothing leaks."""

from __future__ import annotations

import random
from typing import Literal

import anyio
import pytest

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.errors import AskTimeout, RequestCancelled
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.runtime import Runtime
from agentrt.runtime.supervision import Supervision
from agentrt.runtime.turn_events import TurnResult
from agentrt.tools import tool
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

pytestmark = pytest.mark.slow


# enum / bool arguments keep a random model's forced calls short
@tool(timeout=0.2, retries=1)
async def lookup(key: Literal["alpha", "beta", "gamma"]) -> str:
    """Look a key up.

    Args:
        key: which key
    """
    if key == "gamma":
        await anyio.sleep(1.0)  # times out
    return f"value-{key}"


@tool
def flaky(fail: bool) -> str:
    """Succeed or raise.

    Args:
        fail: whether to raise
    """
    if fail:
        raise RuntimeError("asked to fail")
    return "fine"


def test_sixteen_agents_with_flaky_tools_and_cancellations():
    lm = tiny_model_with_tokenizer()
    rng = random.Random(0)
    outcomes = {"ok": 0, "cancelled": 0, "tool_errors": 0, "tool_ok": 0}

    async def agent_loop(rt, i):
        ref = await rt.spawn(Agent(f"agent{i}", "You call tools.", [lookup, flaky],
                                   settings=GenerationSettings(max_tokens=48, temperature=1.0, seed=i),
                                   max_tool_rounds=2,
                                   tool_choice="required"), name=f"agent{i}")
        for turn in range(5):
            timeout = 0.05 if rng.random() < 0.2 else 60
            try:
                res = await ref.ask(f"turn {turn}: please use a tool", timeout=timeout)
            except (AskTimeout, RequestCancelled):
                outcomes["cancelled"] += 1
                continue
            assert isinstance(res, TurnResult)
            outcomes["ok"] += 1
            for r in res.tool_results:
                outcomes["tool_errors" if r.is_error else "tool_ok"] += 1

    async def main():
        cfg = EngineConfig(kv_cache_tokens=24576, max_session_seqs=16, debug_invariants=True)
        async with Engine(lm, cfg) as eng:
            async with Runtime(eng, default_supervision=Supervision(max_restarts=5)) as rt:
                async with anyio.create_task_group() as tg:
                    for i in range(16):
                        tg.start_soon(agent_loop, rt, i)
                await rt.stop_all()
            with anyio.fail_after(30):
                while eng.stats().running or eng.stats().waiting:
                    await anyio.sleep(0.01)
            await eng.run_in_step_thread(eng.core.check_invariants)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
            assert eng.core.pool.num_free("session") == 16
    anyio.run(main)
    assert outcomes["ok"] >= 40 and outcomes["cancelled"] >= 5
    assert outcomes["tool_ok"] > 0 and outcomes["tool_errors"] > 0
