"""End to end on the embedded SmolLM2: a constrained tool call, a real Python function, the
result in the same session, a final answer, and delta-only prefill on the second round. Runs on
the fp32 reference and on the GGUF's own quantization, with a float16 and an int8 KV store (the
same tool calls are required)."""

from __future__ import annotations

import anyio
import pytest

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.runtime import Runtime
from agentrt.runtime.turn_events import RoundStarted, TurnResult
from agentrt.tools import tool

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

CALLS: list[tuple] = []


@tool
def get_weather(city: str) -> dict:
    """Current weather for a city.

    Args:
        city: the city name, e.g. "Paris"
    """
    CALLS.append(("get_weather", city))
    return {"city": city, "temperature_c": 18, "sky": "cloudy"}


@tool
def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a temperature between celsius and fahrenheit.

    Args:
        value: the number to convert
        from_unit: "celsius" or "fahrenheit"
        to_unit: "celsius" or "fahrenheit"
    """
    CALLS.append(("convert_units", value))
    return value * 9 / 5 + 32 if from_unit.startswith("c") else (value - 32) * 5 / 9


@pytest.fixture(params=["fp32", "native", "native-int8-kv"])
def lm(request, embedded, embedded_native, embedded_native_int8):
    return {"fp32": embedded, "native": embedded_native, "native-int8-kv": embedded_native_int8}[request.param]


def test_required_tool_call_runs_and_second_round_prefills_only_its_delta(lm):
    CALLS.clear()

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as eng:
            async with Runtime(eng) as rt:
                agent = Agent("weather", "You are a weather assistant. Use the tools.",
                              [get_weather, convert_units], tool_choice="required",
                              settings=GenerationSettings(max_tokens=64), max_tool_rounds=1)
                ref = await rt.spawn(agent)
                events = [ev async for ev in ref.ask_stream("What is the weather in Paris?")]
                return events, agent
    events, agent = anyio.run(main)
    result = events[-1]
    assert isinstance(result, TurnResult)
    first_call = result.messages[0]["tool_calls"][0]["function"]
    assert first_call["name"] in ("get_weather", "convert_units")
    assert CALLS and CALLS[0][0] == first_call["name"]  # the Python function ran
    tool_msg = result.messages[1]
    assert tool_msg["role"] == "tool" and not result.tool_results[0].is_error
    assert result.rounds == 2 and result.messages[-1]["role"] == "assistant"
    # round 2 reused the session: all of round 1's prompt, and the call's ids up to where the
    # tokenizer's own spelling of the grammar-shaped call differs (that part is recomputed)
    rounds = [ev for ev in events if isinstance(ev, RoundStarted)]
    u1, u2 = result.usage
    assert u2.prompt_tokens == rounds[1].prompt_tokens
    assert u1.prompt_tokens <= u2.cached_tokens <= u1.prompt_tokens + u1.completion_tokens - 1
    assert u2.computed_prompt_tokens == u2.prompt_tokens - u2.cached_tokens
    assert u2.computed_prompt_tokens < 0.35 * u2.prompt_tokens
