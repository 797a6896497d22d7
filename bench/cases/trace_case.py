"""What tracing costs an agent turn (issue 35): the same tool-calling turns with OpenTelemetry
tracing off and on (the SDK's in-memory exporter behind a simple span processor, so every span is
exported before the turn ends), alternating, on the embedded model.

Three agents, each with one tool, take turns on a Runtime: a required tool call, its Python
function, then the answer (greedy, so both modes run the same tokens). A turn's time is its
`ask` from the caller; the overhead is the median turn with tracing on over the median off,
minus one. bench_agents runs it (agents.json `tracing`); alone it writes tracing.json.

    python -m bench.cases.trace_case --quick
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import anyio

from agentrt import Agent, Engine, EngineConfig, Runtime, tool, tracing  # noqa: E402
from agentrt.runtime.agent import GenerationSettings  # noqa: E402


@tool
def get_weather(city: str) -> dict:
    """Current weather for a city.

    Args:
        city: the city name, e.g. "Paris"
    """
    return {"city": city, "temperature_c": 18, "sky": "cloudy"}


@tool
def get_time(city: str) -> str:
    """The local time in a city.

    Args:
        city: the city name, e.g. "Tokyo"
    """
    return f"14:05 in {city}"


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


AGENTS = [("weather", "You answer weather questions with get_weather.", get_weather, "What is the weather in Oslo?"),
          ("clock", "You tell the time with get_time.", get_time, "What time is it in Lima?"),
          ("math", "You add numbers with add.", add, "What is 12 plus 30?")]


async def turns(lm, rounds: int, on: bool) -> tuple[list[float], int]:
    """Per-turn seconds of `rounds` rounds of the three agents (sequential asks), and the spans
    exported (0 when off)."""
    exporter = None
    if on:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter, provider = InMemorySpanExporter(), TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracing.enable(provider)
    try:
        times = []
        async with Engine(lm, EngineConfig(kv_cache_tokens=16384, response_cache_size=0)) as eng:
            async with Runtime(eng) as rt:
                refs = [await rt.spawn(Agent(n, instr, [t], tool_choice="required", max_tool_rounds=1,
                                             settings=GenerationSettings(max_tokens=48)))
                        for n, instr, t, _ in AGENTS]
                for _ in range(rounds):
                    for ref, (*_, question) in zip(refs, AGENTS):
                        t0 = time.perf_counter()
                        await ref.ask(question)
                        times.append(time.perf_counter() - t0)
        return times, len(exporter.get_finished_spans()) if exporter is not None else 0
    finally:
        tracing.disable()


def run(lm, reps: int = 3, rounds: int = 2) -> dict:
    """Alternating off/on runs; medians per turn."""
    anyio.run(turns, lm, 1, False)  # warm-up (kernels, grammar caches)
    off, on, spans = [], [], 0
    for _ in range(reps):
        off += anyio.run(turns, lm, rounds, False)[0]
        t, n = anyio.run(turns, lm, rounds, True)
        on += t
        spans += n
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {"turn_s_tracing_off": m_off, "turn_s_tracing_on": m_on, "tracing_overhead_per_turn": m_on / m_off - 1,
            "turns_per_mode": len(off), "spans_per_turn": spans / len(on), "exporter": "in-memory, simple processor"}


def main() -> None:
    from agentrt import load_model
    from bench.common import machine, write_results

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    res = run(load_model("smollm2-135m"), *((3, 2) if args.quick else (5, 4)))
    print(json.dumps(res, indent=1))
    print("wrote", write_results("tracing", {**res, "machine": machine(), "quick": args.quick}))


if __name__ == "__main__":
    main()
