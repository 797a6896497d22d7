"""A LangGraph supervisor with three specialist agents, each an agentrt agent actor, on the
embedded SmolLM2-135M.

Each node runs an agentrt `Agent` as an actor of the thread (`Runtime.actor`: its own model -> tool
loop with direct Python calls, in its own KV session) and returns the messages its turn added;
the checkpoint stays the source of truth. A node opens its agent's conversation with worked
examples as real chat turns (a question, the call, its result): a 135M model copies a worked
example far better than it follows a description. (`agent_node` hands an agent the graph's
messages only; the `--handoffs` mode below uses it.)

What makes the 135M model route and compute right, on questions beyond its examples:
  * the supervisor makes one call, `route(topic, specialist)` (a named tool choice, written under
    the grammar): `specialist` is an enum with one short line per specialist in its description
    (`weather (weather in a city)`, `math (arithmetic)`, `flight (flights between cities)`), each
    a single token, so the model chooses at one token; `topic` (a few words) lets it copy what
    the question is about just before it chooses. A conditional edge then sends the graph to that
    specialist (LangGraph's "supervisor with a router" pattern);
  * the math agent's tool is `calculate(a, op, b)` where `op` is an enum it can read: `add`,
    `subtract`, `multiply`, `divide`, each described by its signs and words (`divide (/, divided
    by)`), with worked examples of every operation. (With `+ - * /` as the enum, it wrote `+` or
    `*` for most subtractions and divisions.);
  * each specialist must call its one tool (a named tool choice), and its turn ends when the tool
    has run: the answer is the tool's result (a 135M model cannot phrase one reliably);
  * the call is checked against the question before it is an answer (`unfounded`): its numbers,
    its operation (a sign or word of it) and its cities must be in the question, and a flight goes
    from the city after "from" to another one. A call that fails is a question beyond the 135M
    model (or its specialists), and the program says so instead of answering.
Each question is its own thread: on a long shared history the 135M model repeats its earlier
choices.

`--handoffs` instead gives the supervisor `agent_node(..., handoffs=...)`'s `transfer_to_<name>`
tools, which the node turns into `Command(goto=<name>)`. There the model names the specialist in
the tool name's first tokens and writes the task in free text, with no example turns to copy: the
135M hands some of these questions to no one or to the wrong specialist. That mode needs a bigger
model: `--handoffs --model path/to/model.gguf`.
    python examples/langgraph_supervisor.py
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Literal

import anyio
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from pydantic import Field

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, load_model, tool
from agentrt.integrations.langgraph import agent_node

SPECIALISTS = {"weather": "Ask the weather agent: the weather in a city.",
               "math": "Ask the math agent: add, subtract, multiply or divide two numbers.",
               "flight": "Ask the flight agent: flights between two cities."}
QUESTIONS = ["What is the weather in Oslo?", "What is 12 times 7?", "Find me a flight from Paris to Rome.",
             "Is it raining in London?", "What is 100 divided by 8?", "What is 45 minus 17?"]


# ---- the specialists' tools ------------------------------------------------------------------

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


SIGNS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}


@tool
def calculate(a: float, op: Literal["add", "subtract", "multiply", "divide"], b: float) -> str:
    """Compute a op b.

    Args:
        a: the first number
        op: add (+, plus), subtract (-, minus), multiply (*, x, times), divide (/, divided by)
        b: the second number
    """
    if op == "divide" and b == 0:
        return f"{a:g} / 0: division by zero"
    value = {"add": a + b, "subtract": a - b, "multiply": a * b, "divide": a / b if b else 0.0}[op]
    return f"{a:g} {SIGNS[op]} {b:g} = {value:g}"


@tool
def find_flight(origin: str, destination: str) -> str:
    """Cheapest direct flight between two cities.

    Args:
        origin: departure city
        destination: arrival city
    """
    return f"{origin} -> {destination}: direct, 2 h 30, 129 EUR (demo data)"


# ---- the supervisor's one constrained choice -------------------------------------------------

@tool
def route(topic: Annotated[str, Field(max_length=30)], specialist: Literal["weather", "math", "flight"]) -> str:
    """Send the question to a specialist.

    Args:
        topic: what the question is about, in two or three words
        specialist: weather (weather in a city), math (arithmetic), flight (flights between cities)
    """
    return specialist


ROUTER = "You route each question to the right specialist."
HANDOFF_ROUTER = ("You route each question to one agent. Examples:\n"
                  "'Is it raining in Rome?' -> transfer_to_weather\n"
                  "'What is 3 times 4?' -> transfer_to_math\n"
                  "'A flight from Oslo to Nice?' -> transfer_to_flight")

# worked examples, as real chat turns at the start of each agent's conversation: (question, call)
EXAMPLES = {
    "supervisor": [("Is it sunny in Rome?", route, {"topic": "sun in Rome", "specialist": "weather"}),
                   ("What is 3 plus 4?", route, {"topic": "3 plus 4", "specialist": "math"}),
                   ("Is there a flight from Oslo to Bergen?", route,
                    {"topic": "flight Oslo to Bergen", "specialist": "flight"})],
    "math": [("What is 8 / 2?", calculate, {"a": 8, "op": "divide", "b": 2}),
             ("What is 30 minus 4?", calculate, {"a": 30, "op": "subtract", "b": 4}),
             ("What is 5 times 6?", calculate, {"a": 5, "op": "multiply", "b": 6}),
             ("What is 2.5 minus 1?", calculate, {"a": 2.5, "op": "subtract", "b": 1}),
             ("What is 1 + 2?", calculate, {"a": 1, "op": "add", "b": 2})],
}


def worked_examples(name: str) -> list[dict]:
    """EXAMPLES[name] as chat turns: the question, the assistant's call, the tool's result."""
    msgs: list[dict] = []
    for i, (question, fn, args) in enumerate(EXAMPLES.get(name, [])):
        call = {"id": f"example_{i}", "type": "function",
                "function": {"name": fn.name, "arguments": json.dumps(args)}}
        msgs += [{"role": "user", "content": question},
                 {"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "name": fn.name, "content": str(fn(**args))}]
    return msgs


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
        "math": Agent("math", "You compute with calculate.", [calculate], **one_call("calculate")),
        "flight": Agent("flight", "You find flights with find_flight.", [find_flight], **one_call("find_flight")),
    }


# ---- graph nodes over agent actors -----------------------------------------------------------

def as_langchain(messages: list[dict], name: str) -> list[BaseMessage]:
    """An agent turn's messages (chat-format dicts) as LangChain messages."""
    out: list[BaseMessage] = []
    for d in messages:
        if d["role"] == "tool":
            out.append(ToolMessage(d["content"], tool_call_id=d["tool_call_id"], name=d.get("name")))
        else:
            calls = [{"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"]), "id": c["id"]}
                     for c in d.get("tool_calls", ())]
            out.append(AIMessage(d.get("content") or "", tool_calls=calls, name=name))
    return out


def worked_node(agent: Agent, rt: Runtime):
    """A node backed by `agent`'s actor for the thread: a new actor's conversation opens with the
    agent's worked examples; the node asks it the thread's last question."""
    async def node(state, config) -> dict:
        thread = config["configurable"]["thread_id"]
        held = rt.actors.get(f"{agent.name}/{thread}")  # (Runtime.actor names an actor kind/key)
        actor = await rt.actor(agent.name, thread, lambda _: agent.fresh())
        question = next(m.content for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
        opening = worked_examples(agent.name) if held is None or held.stopped else []
        result = await actor.ask(opening + [{"role": "user", "content": question}])
        return {"messages": as_langchain(result.messages, agent.name)}

    node.__name__ = agent.name
    return node


def routed_specialist(state) -> str:
    """The conditional edge after the supervisor: the specialist its `route` call chose."""
    last = state["messages"][-1]
    return last.content if isinstance(last, ToolMessage) and last.content in SPECIALISTS else "__end__"


def build(rt, handoffs: bool = False):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    a = agents(handoffs)
    g = StateGraph(MessagesState)
    if handoffs:
        g.add_node("supervisor", agent_node(a["supervisor"], rt, handoffs=SPECIALISTS),
                   destinations=tuple(SPECIALISTS))
    else:
        g.add_node("supervisor", worked_node(a["supervisor"], rt))
        g.add_conditional_edges("supervisor", routed_specialist, [*SPECIALISTS, END])
    for name in SPECIALISTS:
        g.add_node(name, worked_node(a[name], rt))
        g.add_edge(name, END)
    g.add_edge(START, "supervisor")
    return g.compile(checkpointer=InMemorySaver())


# ---- the answer: the tool's result, once the call is checked against the question -------------

NUMBER = re.compile(r"\d+(?:\.\d+)?")
OP_WORDS = {"add": ("+", "plus", "add", "sum"), "subtract": ("-", "minus", "subtract", "take", "less"),
            "multiply": ("*", "x", "×", "times", "multiplied", "multiply", "product"),
            "divide": ("/", "÷", "divided", "divide", "over")}


def unfounded(question: str, args: dict) -> list[str]:
    """What a call says that `question` does not (empty: nothing): each number must be one of the
    question's, the operation must have a sign or word of it there, a city must be named there,
    and a trip goes from the city after "from" (if the question says one) to another city. A 135M
    model sometimes makes one of them up."""
    q = question.lower()
    words = re.findall(r"[a-z]+|[^\sa-z0-9.?!,']", q)  # words, and signs such as + - * / x
    numbers = [float(n) for n in NUMBER.findall(q)]  # (each one may be used once)
    bad = []
    for k, v in args.items():
        if isinstance(v, (int, float)):
            ok = abs(v) in numbers
            if ok:
                numbers.remove(abs(v))
        elif k == "op":
            ok = any(w in words for w in OP_WORDS.get(v, ()))
        else:
            ok = bool(re.search(r"[a-z]", str(v).lower()) and re.search(rf"\b{re.escape(str(v).lower())}\b", q))
        if not ok:
            bad.append(f"{k}={v!r}")
    start = re.search(r"\bfrom ([a-z]+)", q)  # a trip goes from the city after "from"
    if "origin" in args and start and str(args["origin"]).lower() != start.group(1) and not bad:
        bad.append(f"origin={args['origin']!r} (not the city after 'from')")
    if "origin" in args and str(args["origin"]).lower() == str(args.get("destination")).lower():
        bad.append("origin = destination")
    return bad


def answer(question: str, messages: list[BaseMessage]) -> str:
    """What the program answers: the specialist tool's result, or why it gives none."""
    def specialist(name: str | None) -> bool:
        return name != "route" and not (name or "").startswith("transfer_to_")

    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls if specialist(c["name"])]
    results = [m for m in messages if isinstance(m, ToolMessage) and specialist(m.name)]
    if not calls or not results:
        return "no answer: no specialist was called"
    bad = unfounded(question, calls[-1]["args"])
    if bad:
        return (f"no answer: the question does not say {calls[-1]['name']}'s {', '.join(bad)}; it is beyond "
                "the 135M model or its specialists: --model path/to/model.gguf for a bigger model")
    return results[-1].content


def show(question: str, messages, t0: float) -> None:
    for m in messages:
        stamp = f"[{time.perf_counter() - t0:5.1f}s]"
        if isinstance(m, AIMessage):
            for c in m.tool_calls:
                print(f"  {stamp} {m.name}: call {c['name']}({c['args']})")
            if m.content.strip():
                print(f"  {stamp} {m.name}: {m.content.strip()!r}")
        elif isinstance(m, ToolMessage):
            print(f"  {stamp} {m.name} -> {m.content}")
    print(f"  answer: {answer(question, messages)}")


async def main(source: str, handoffs: bool) -> None:
    lm = load_model(source)
    if handoffs and source == "smollm2-135m":
        print("note: --handoffs needs a bigger model than the embedded 135M, which hands some of these "
              "questions to no one or to the wrong specialist; pass --model path/to/model.gguf")
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
        graph = build(rt, handoffs)
        for i, q in enumerate(QUESTIONS):
            cfg = {"configurable": {"thread_id": f"question-{i + 1}"}}  # one thread per question
            print(f"user: {q}")
            t0 = time.perf_counter()
            out = await graph.ainvoke({"messages": [HumanMessage(q)]}, cfg)
            show(q, out["messages"][1:], t0)
        print("agent actors:", sorted(rt.actors))
        await rt.stop_all()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    ap.add_argument("--handoffs", action="store_true", help="route with transfer_to_<name> tools (bigger models)")
    args = ap.parse_args()
    anyio.run(main, args.model, args.handoffs)
