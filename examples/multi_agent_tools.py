"""Multi-agent demo on the embedded SmolLM2-135M: a planner delegates to three specialists.

Each agent is an actor with its own KV session and its own Python tools. The planner's tools
are the specialists themselves (`ask_weather`, `ask_math`, `ask_travel`): calling one sends the
question to that agent's mailbox and returns its answer. Tool calls are constrained by a
grammar, validated while they stream, and run as plain Python functions. Everything prints as
it happens.   python examples/multi_agent_tools.py
"""

from __future__ import annotations

import time

import anyio

from agentrt import Engine, EngineConfig, load_model
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.events import CallComplete, CallInvalid, TextDelta, ToolResultEvent, TurnResult
from agentrt.runtime.runtime import Runtime
from agentrt.tools import ToolContext, tool

# ---- the specialists' tools: plain Python ------------------------------------------------


@tool
def get_weather(city: str) -> dict:
    """Current weather for a city.

    Args:
        city: the city, e.g. "Paris"
    """
    table = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (3, "snow")}
    temp, sky = table.get(city.lower(), (20, "clear"))
    return {"city": city, "temperature_c": temp, "sky": sky}


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: first term
        b: second term
    """
    return a + b


@tool
def train_time(origin: str, destination: str) -> str:
    """Travel time by train between two cities.

    Args:
        origin: departure city
        destination: arrival city
    """
    return f"{origin} -> {destination}: about {2 + (len(origin) + len(destination)) % 5} h by train"


# ---- the planner's tools: delegation to the specialists ----------------------------------


async def _delegate(ctx: ToolContext, agent: str, question: str) -> str:
    print(f"    -> {agent}: {question}")
    result = await ctx.deps[agent].ask(question, timeout=300)
    for m in result.messages:
        for call in m.get("tool_calls", []):
            print(f"       {agent} called {call['function']['name']}({call['function']['arguments']})")
        if m["role"] == "tool":
            print(f"       {agent} tool result: {m['content']}")
    print(f"    <- {agent}: {result.text}")
    return result.text or "(no answer)"


@tool
async def ask_weather(question: str, ctx: ToolContext) -> str:
    """Ask the weather specialist.

    Args:
        question: the question about weather
    """
    return await _delegate(ctx, "weather", question)


@tool
async def ask_math(question: str, ctx: ToolContext) -> str:
    """Ask the math specialist to compute something.

    Args:
        question: the computation, in words or numbers
    """
    return await _delegate(ctx, "math", question)


@tool
async def ask_travel(question: str, ctx: ToolContext) -> str:
    """Ask the travel specialist about trains between cities.

    Args:
        question: the travel question
    """
    return await _delegate(ctx, "travel", question)


TASKS = ["What is the weather in Tokyo?", "How long is the train from Paris to Lyon?",
         "What is 12 times 7?"]


async def main() -> None:
    t0 = time.perf_counter()
    lm = load_model("smollm2-135m")
    print(f"loaded {lm.source.split('/')[-1]} in {time.perf_counter() - t0:.1f}s")
    settings = GenerationSettings(max_tokens=80)
    one = {"settings": settings, "max_tool_rounds": 1, "tool_choice": "required",
           "parallel_tool_calls": False}  # a 135M model repeats calls when allowed several
    async with Engine(lm, EngineConfig(kv_cache_tokens=32768)) as engine:
        async with Runtime(engine) as rt:
            refs = {
                "weather": await rt.spawn(Agent("weather", "You report the weather. Use get_weather.",
                                                [get_weather], **one)),
                "math": await rt.spawn(Agent("math", "You compute with the tools.", [multiply, add], **one)),
                "travel": await rt.spawn(Agent("travel", "You answer train questions. Use train_time.",
                                               [train_time], **one)),
            }
            planner = await rt.spawn(Agent(
                "planner", "You are a planner. Delegate each question to the right specialist tool.",
                [ask_weather, ask_math, ask_travel], deps=refs, **one))
            for task in TASKS:
                await run_task(planner, task)
            st = engine.stats()
            print(f"\nengine: {st.steps} steps, prompt tokens {st.prompt_submitted} submitted, "
                  f"{st.prompt_computed} computed (KV hit rate {st.hit_rate:.0%}), "
                  f"{st.decode_tokens} decoded, speculation acceptance {st.spec_acceptance:.0%}")
            await rt.stop_all()
    print(f"done in {time.perf_counter() - t0:.1f}s")


async def run_task(planner, task: str) -> None:
    print(f"\nuser -> planner: {task}")
    t = time.perf_counter()
    async for ev in planner.ask_stream(task):
        if isinstance(ev, CallComplete):
            print(f"  planner calls {ev.name}({ev.arguments})")
        elif isinstance(ev, CallInvalid):
            print(f"  planner made an invalid call: {ev.reason}")
        elif isinstance(ev, ToolResultEvent) and ev.result.is_error:
            print(f"  tool error: {ev.result.content}")
        elif isinstance(ev, TurnResult):
            print(f"planner: {ev.text}   [{time.perf_counter() - t:.1f}s, "
                  f"{sum(u.cached_tokens for u in ev.usage)} prompt tokens reused from KV]")
        elif isinstance(ev, TextDelta):
            pass


if __name__ == "__main__":
    anyio.run(main)
