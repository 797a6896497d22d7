"""A LangGraph supervisor with three worker agents, each an agentrt agent actor, on the
embedded SmolLM2-135M.

`agent_node` turns an agentrt `Agent` into a graph node: the agent runs its own model -> tool
loop with direct Python calls in its own KV session (one per thread), and the node returns the
messages it added; the checkpoint stays the source of truth.

Routing. The supervisor makes one call, `route(topic, worker)` (a named tool choice, constrained
by the grammar): `worker` is an enum of the workers, named with words the questions use
(`calculator`, `flights`; named `math` and `travel`, the 135M sends the Oslo weather question to
`travel`), and `topic` (a few words) lets the model copy what the question is about just before
it chooses; a conditional edge then sends the graph to that worker (LangGraph's "supervisor with a router" pattern). Each worker must call its
one tool, and its turn ends when the tool has run: the answer is the tool's result (a 135M model
cannot phrase one reliably). Each question is its own thread: on a long shared history the 135M
model repeats its earlier choices.

`--handoffs` instead gives the supervisor `agent_node(..., handoffs=...)`'s `transfer_to_<worker>`
tools, which the node turns into `Command(goto=<worker>)`. There the model names the worker in
the tool name's first tokens, with nothing to go on: the 135M sends half of these questions
to the wrong worker. That mode needs a bigger model: `--handoffs --model path/to/model.gguf`.
    python examples/langgraph_supervisor.py
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import anyio
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from pydantic import Field

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, load_model, tool
from agentrt.integrations.langgraph import agent_node

WORKERS = {"weather": "Ask the weather agent: weather, temperature, rain or snow in a city.",
           "calculator": "Ask the calculator agent: add, subtract, multiply or divide numbers.",
           "flights": "Ask the flights agent: flights between cities."}
QUESTIONS = ["What is the weather in Oslo?", "What is 12 times 7?", "Find me a flight from Paris to Rome.",
             "Is it raining in London?"]


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city, e.g. "Paris"
    """
    table = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (-3, "snowing"), "london": (12, "raining")}
    if city.strip().lower() not in table:
        return f"no weather data for {city}"
    temp, sky = table[city.strip().lower()]
    return f"{city}: {temp} °C, {sky}"


@tool
def calculate(a: float, op: Literal["+", "-", "*", "/"], b: float) -> str:
    """Compute `a op b`.

    Args:
        a: the first number
        op: the operation: + plus, - minus, * times, / divided by
        b: the second number
    """
    if op == "/" and b == 0:
        return f"{a:g} / 0: division by zero"
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0}[op]
    return f"{a:g} {op} {b:g} = {value:g}"


@tool
def find_flight(origin: str, destination: str) -> str:
    """Cheapest direct flight between two cities.

    Args:
        origin: departure city
        destination: arrival city
    """
    return f"{origin} -> {destination}: direct, 2 h 30, 129 EUR (demo data)"


@tool
def route(topic: Annotated[str, Field(max_length=30)], worker: Literal["weather", "calculator", "flights"]) -> str:
    """Send the question to an agent.

    Args:
        topic: what the question is about, in two or three words
        worker: the agent for it
    """
    return worker


ROUTER = ("You route each question to one agent. Examples:\n"
          "'Is it raining in Rome?' -> route(topic='rain in Rome', worker='weather')\n"
          "'What is the weather in Bern?' -> route(topic='weather in Bern', worker='weather')\n"
          "'What is 3 times 4?' -> route(topic='3 times 4', worker='calculator')\n"
          "'A flight from Lyon to Nice?' -> route(topic='flight Lyon to Nice', worker='flights')")
HANDOFF_ROUTER = ("You route each question to one agent. Examples:\n"
                  "'Is it raining in Rome?' -> transfer_to_weather\n"
                  "'What is 3 times 4?' -> transfer_to_calculator\n"
                  "'A flight from Oslo to Nice?' -> transfer_to_flights")


def one_call(tool_name: str | None) -> dict:
    """Exactly one call (of `tool_name`, or of any tool when None); the turn ends when it has run."""
    return dict(tool_choice=tool_name or "required", stop_at_tools=[tool_name] if tool_name else [],
                settings=SamplingParams(max_tokens=64), max_tool_rounds=1, parallel_tool_calls=False)


def agents(handoffs: bool) -> dict[str, Agent]:
    return {
        "supervisor": Agent("supervisor", HANDOFF_ROUTER, **one_call(None)) if handoffs else
        Agent("supervisor", ROUTER, [route], **one_call("route")),
        "weather": Agent("weather", "You answer weather questions with get_weather.", [get_weather],
                         **one_call("get_weather")),
        "calculator": Agent("calculator", "You compute with calculate.", [calculate], **one_call("calculate")),
        "flights": Agent("flights", "You find flights with find_flight.", [find_flight], **one_call("find_flight")),
    }


def routed_worker(state) -> str:
    """The conditional edge after the supervisor: the worker its `route` call chose."""
    last = state["messages"][-1]
    return last.content if isinstance(last, ToolMessage) and last.content in WORKERS else "__end__"


def build(rt, handoffs: bool = False):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    a = agents(handoffs)
    g = StateGraph(MessagesState)
    if handoffs:
        g.add_node("supervisor", agent_node(a["supervisor"], rt, handoffs=WORKERS), destinations=tuple(WORKERS))
    else:
        g.add_node("supervisor", agent_node(a["supervisor"], rt))
        g.add_conditional_edges("supervisor", routed_worker, [*WORKERS, END])
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
    last = messages[-1] if messages else None
    if isinstance(last, ToolMessage) and last.name not in ("route",) and not last.name.startswith("transfer_to_"):
        print(f"  answer: {last.content}")


async def main(source: str, handoffs: bool) -> None:
    lm = load_model(source)
    if handoffs and source == "smollm2-135m":
        print("note: --handoffs needs a bigger model than the embedded 135M, which sends half of these "
              "questions to the wrong worker; pass --model path/to/model.gguf")
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
        graph = build(rt, handoffs)
        for i, q in enumerate(QUESTIONS):
            cfg = {"configurable": {"thread_id": f"question-{i + 1}"}}  # one thread per question
            print(f"user: {q}")
            t0 = time.perf_counter()
            out = await graph.ainvoke({"messages": [HumanMessage(q)]}, cfg)
            show(out["messages"][1:], t0)
        print("agent actors:", sorted(rt.actors))
        await rt.stop_all()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    ap.add_argument("--handoffs", action="store_true", help="route with transfer_to_<worker> tools (bigger models)")
    args = ap.parse_args()
    anyio.run(main, args.model, args.handoffs)
