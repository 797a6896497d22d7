"""Pipelined tool execution, measured on the real model (bench_agents.py --tool-latency S).

One agent turn on the embedded model whose first round writes several calls of a tool that
takes S seconds (tool_choice "required", parallel calls, greedy): once with the tool declared
`pure` (each call starts the moment it validates, while the model writes the next one) and once
not (calls start together when the round ends). Greedy decoding makes both runs write the same
tokens, so the difference is the dispatch alone. Runs alternate; medians are reported.

Two latency profiles: "equal" (every call takes S: the last call, validated just before the round
ends, bounds the turn either way, so the saving is only the round's tail after it) and
"first_slowest" (apples S, pears S/4, plums S/10: a slow lookup written first overlaps the
decoding of the calls after it).
"""

from __future__ import annotations

import statistics
import time
from typing import Literal

import anyio

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, Tool

QUESTION = "Look up the stock of apples, pears and plums."


PROFILES = {"equal": {"apples": 1.0, "pears": 1.0, "plums": 1.0},
            "first_slowest": {"apples": 1.0, "pears": 0.25, "plums": 0.1}}


def _tool(latency: float, pure: bool, profile: dict[str, float]) -> Tool:
    async def stock(fruit: Literal["apples", "pears", "plums"]) -> str:
        """Units in stock of one fruit.

        Args:
            fruit: which fruit
        """
        await anyio.sleep(latency * profile[fruit])
        return f"{fruit}: 12"

    return Tool.from_function(stock, pure=pure)


async def _turn(engine: Engine, latency: float, pure: bool, profile: dict[str, float]) -> tuple[float, int, list]:
    agent = Agent("shop", "You check stock with the stock tool, one call per fruit.", [_tool(latency, pure, profile)],
                  tool_choice="required", max_tool_rounds=1, settings=SamplingParams(max_tokens=96))
    async with Runtime(engine) as rt:
        ref = await rt.spawn(agent, name="shop")
        t0 = time.perf_counter()
        result = await ref.ask(QUESTION)
        wall = time.perf_counter() - t0
    calls = result.messages[0].get("tool_calls", [])
    return wall, len(calls), [c["function"]["arguments"] for c in calls]


def run_pipelined(lm, latency: float, reps: int = 3) -> dict:
    """Per latency profile: median turn wall time with and without pure tools (both runs must
    write the same calls)."""
    async def main() -> dict:
        out = {}
        async with Engine(lm, EngineConfig(response_cache_size=0)) as engine:
            await _turn(engine, 0.0, False, PROFILES["equal"])  # warm up (grammar compile, kernels)
            for name, profile in PROFILES.items():
                out[name] = await _profile(engine, latency, profile, reps)
        return {"tool_latency_s": latency, **out}

    return anyio.run(main)


async def _profile(engine: Engine, latency: float, profile: dict[str, float], reps: int) -> dict:
    times: dict[bool, list[float]] = {True: [], False: []}
    seen: dict[bool, list] = {}
    for _ in range(reps):
        for pure in (False, True):
            wall, _, args = await _turn(engine, latency, pure, profile)
            times[pure].append(wall)
            seen[pure] = args
    if seen[True] != seen[False]:
        raise RuntimeError("pure and non-pure runs wrote different calls; the comparison is void")
    seq, pipe = statistics.median(times[False]), statistics.median(times[True])
    return {"calls": seen[True], "turn_s_sequential": seq, "turn_s_pipelined": pipe,
            "saved_s": seq - pipe, "saved_fraction": (seq - pipe) / seq, "reps": reps}
