"""A LangGraph supervisor with three worker agents, each an agentrt agent actor, on the
embedded SmolLM2-135M.

`agent_node` turns an agentrt `Agent` into a graph node: the agent runs its own model -> tool
loop with direct Python calls in its own KV session (one per thread), and the node returns the
messages it added; the checkpoint stays the source of truth. The supervisor hands each question
to a worker with a `transfer_to_<worker>` tool call, which the node turns into
`Command(goto=<worker>)`. Tool calls are grammar-constrained, so every handoff is well formed.

The 135M model routes poorly (it tends to pick one worker for everything); the mechanics are
the same with a larger model: `--model path/to/model.gguf`.
    python examples/langgraph_supervisor.py
"""

from __future__ import annotations

import time

import anyio
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from agentrt import Agent, Engine, EngineConfig, GenerationSettings, Runtime, load_model, tool
from agentrt.integrations.langgraph import agent_node

WORKERS = {"weather": "Ask the weather agent: weather, temperature, rain or snow in a city.",
           "math": "Ask the math agent: multiply or compute numbers.",
           "travel": "Ask the travel agent: flights and trips between cities."}


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
def find_flight(origin: str, destination: str) -> dict:
    """Cheapest direct flight between two cities.

    Args:
        origin: departure city
        destination: arrival city
    """
    return {"from": origin, "to": destination, "price_eur": 129, "duration_h": 2.5}


def agents() -> dict[str, Agent]:
    one_call = dict(tool_choice="required", settings=GenerationSettings(max_tokens=48), max_tool_rounds=1,
                    parallel_tool_calls=False)
    return {
        "supervisor": Agent("supervisor", "You route each question to one agent. Examples:\n"
                            "'Is it raining in Rome?' -> transfer_to_weather\n"
                            "'What is 3 times 4?' -> transfer_to_math\n"
                            "'A flight from Oslo to Nice?' -> transfer_to_travel", **one_call),
        "weather": Agent("weather", "You answer weather questions with the get_weather tool.", [get_weather],
                         **one_call),
        "math": Agent("math", "You multiply numbers with the multiply tool. Example: 'What is 3 times 4?' -> "
                      "multiply(a=3, b=4).", [multiply], **one_call),
        "travel": Agent("travel", "You find flights with the find_flight tool.", [find_flight], **one_call),
    }


def build(rt):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    a = agents()
    g = StateGraph(MessagesState)
    g.add_node("supervisor", agent_node(a["supervisor"], rt, handoffs=WORKERS), destinations=tuple(WORKERS))
    for name in WORKERS:
        g.add_node(name, agent_node(a[name], rt))
        g.add_edge(name, END)
    g.add_edge(START, "supervisor")
    return g.compile(checkpointer=InMemorySaver())


def show(messages, t0: float) -> None:
    for m in messages:
        stamp = f"[{time.perf_counter() - t0:5.1f}s]"
        if isinstance(m, AIMessage):
            for c in m.tool_calls:
                print(f"  {stamp} {m.name}: call {c['name']}({c['args']})")
            if m.content.strip():
                print(f"  {stamp} {m.name}: {m.content.strip()!r}")
        elif isinstance(m, ToolMessage):
            print(f"  {stamp} {m.name} -> {m.content}")


async def main(source: str) -> None:
    lm = load_model(source)
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
        graph = build(rt)
        cfg = {"configurable": {"thread_id": "demo"}}
        for q in ("What is the weather in Oslo?", "What is 12 times 7?", "Find me a flight from Paris to Rome."):
            print(f"user: {q}")
            t0 = time.perf_counter()
            before = len((await graph.aget_state(cfg)).values.get("messages", []))
            out = await graph.ainvoke({"messages": [HumanMessage(q)]}, cfg)
            show(out["messages"][before + 1:], t0)
        print("agent actors:", sorted(rt.actors))
        await rt.stop_all()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    anyio.run(main, ap.parse_args().model)
