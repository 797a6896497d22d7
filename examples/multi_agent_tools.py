"""Multi-agent demo on the embedded SmolLM2-135M: a router hands each question to one of three
specialist agents, and the specialist calls its Python tool.

    python examples/multi_agent_tools.py            (= make demo)

Every agent is an actor with its own KV session on one shared engine. Each conversation (a
"thread": a question and its follow-ups) gets its own router and specialists, activated on first
use with `Runtime.actor(kind, thread, factory)`; agents of the same kind share their prompt
prefix (instructions, tool schemas, examples), which the engine's radix cache serves, and a
follow-up in a thread prefills only its new tokens from the agent's session.

How it is built so that a 135M model gets it right, on questions beyond the demo's own:
  * the router makes exactly one call, `route(topic, specialist)` (a named tool choice); the
    specialist is an enum with one short line per specialist in its description ("weather
    (weather in a city), calculator (arithmetic), train (trains between cities)"), `topic` (a
    few words, at most 30 characters) lets the model copy what the question is about just before
    it chooses, and three worked examples open each router conversation as real chat turns. The
    program, not the model, then sends the question to that specialist;
  * each specialist has one tool and must call it (a named tool choice); arguments are small
    (a city, two numbers and an operation, two cities). The calculator's operation is an enum
    it can read: "add", "subtract", "multiply", "divide", each described by its signs and words
    ("divide (/, divided by)"), and five worked examples open its conversation. (With the
    question's own words as the enum, "divided by" and "/" came out as "times".);
  * a turn ends when its tool has run (`stop_at_tools`): the final answer is the tool's result,
    printed as is. A model this small cannot reliably phrase an answer from a tool result;
  * before the result is an answer, the call is checked against the question (`unfounded`): its
    numbers, its operation (a sign or word of it) and its cities must be in the question, and a
    train goes from the city after "from" to another one. A call that fails is a question beyond
    the 135M model (or its specialists), and the demo says so instead of answering.
Tool calls are constrained by a grammar, so every call is well formed.

For each question it prints the route, the tool call with its arguments, the answer, and where
the time went per agent turn: prompt tokens prefilled vs reused from KV already held (the agent's
session or the radix cache) and tokens decoded (the engine's usage of each model call, in the
turn's TurnResult), the tool's time and the turn's wall time. Decoded tokens include the few the
engine generated after the call was complete, before the agent's stop reached it: that count,
and the next turn's prefill by as much, vary by a few tokens from run to run; the calls do not.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import anyio
from pydantic import Field

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, load_model, tool

# ---- the specialists' tools: plain Python, with small demo tables -----------------------------

WEATHER = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (-3, "snowing"),
           "london": (12, "raining"), "madrid": (31, "sunny")}
TRAINS = {frozenset({"paris", "lyon"}): "2 h", frozenset({"berlin", "munich"}): "4 h",
          frozenset({"rome", "milan"}): "3 h", frozenset({"oslo", "bergen"}): "7 h"}


@tool
def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
        city: the city, e.g. "Paris"
    """
    if city.strip().lower() not in WEATHER:
        return f"no weather data for {city}"
    temp, sky = WEATHER[city.strip().lower()]
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
def train_time(origin: str, destination: str) -> str:
    """Travel time by train between two cities.

    Args:
        origin: the departure city
        destination: the arrival city
    """
    hours = TRAINS.get(frozenset({origin.strip().lower(), destination.strip().lower()}))
    return f"{origin} -> {destination}: {hours} by train" if hours else \
        f"no train data for {origin} -> {destination}"


# ---- the router: one constrained choice ------------------------------------------------------

Specialist = Literal["weather", "calculator", "train"]


@tool
def route(topic: Annotated[str, Field(max_length=30)], specialist: Specialist) -> str:
    """Send the question to a specialist.

    Args:
        topic: what the question is about, in two or three words
        specialist: weather (weather in a city), calculator (arithmetic), train (trains between cities)
    """
    return specialist


ROUTER_INSTRUCTIONS = "You route each question to the right specialist."

# worked examples, as real chat turns at the start of each agent's conversation (a 135M model
# copies a worked example far better than it follows a description): (question, tool, arguments)
EXAMPLES = {
    "router": [("Is it sunny in Rome?", route, {"topic": "sun in Rome", "specialist": "weather"}),
               ("What is 3 plus 4?", route, {"topic": "3 plus 4", "specialist": "calculator"}),
               ("How long is the train from Oslo to Bergen?", route,
                {"topic": "train Oslo to Bergen", "specialist": "train"})],
    "calculator": [("What is 8 / 2?", calculate, {"a": 8, "op": "divide", "b": 2}),
                   ("What is 30 minus 4?", calculate, {"a": 30, "op": "subtract", "b": 4}),
                   ("What is 5 times 6?", calculate, {"a": 5, "op": "multiply", "b": 6}),
                   ("What is 2.5 minus 1?", calculate, {"a": 2.5, "op": "subtract", "b": 1}),
                   ("What is 1 + 2?", calculate, {"a": 1, "op": "add", "b": 2})],
}


def worked_examples(kind: str) -> list[dict]:
    """EXAMPLES[kind] as chat turns: the question, the assistant's call, the tool's result."""
    msgs: list[dict] = []
    for i, (question, fn, args) in enumerate(EXAMPLES.get(kind, [])):
        call = {"id": f"example_{i}", "type": "function",
                "function": {"name": fn.name, "arguments": json.dumps(args)}}
        msgs += [{"role": "user", "content": question},
                 {"role": "assistant", "content": "", "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": call["id"], "name": fn.name, "content": str(fn(**args))}]
    return msgs


def one_call(tool_name: str) -> dict:
    """Agent options: exactly one call of `tool_name`, and the turn ends when it has run."""
    return dict(tool_choice=tool_name, stop_at_tools=[tool_name], max_tool_rounds=1,
                parallel_tool_calls=False, settings=SamplingParams(max_tokens=128))


AGENTS = {
    "router": lambda: Agent("router", ROUTER_INSTRUCTIONS, [route], **one_call("route")),
    "weather": lambda: Agent("weather", "You report the weather with get_weather.", [get_weather],
                             **one_call("get_weather")),
    "calculator": lambda: Agent("calculator", "You compute with calculate.", [calculate],
                                **one_call("calculate")),
    "train": lambda: Agent("train", "You answer train questions with train_time.", [train_time],
                           **one_call("train_time")),
}

# the demo's conversations: thread -> questions (a later question is a follow-up in that thread)
THREADS = {
    "alice": ["What is the weather in Tokyo?", "And in Oslo?"],
    "bob": ["How long is the train from Paris to Lyon?"],
    "carol": ["What is 12 times 7?", "What is 345 plus 678?"],
    "dave": ["Will it rain in London today?"],
    "erin": ["What is 1000 minus 1?", "What is 100 divided by 8?"],
}
# what each question should produce: (specialist, tool, arguments)
EXPECTED = {
    "What is the weather in Tokyo?": ("weather", "get_weather", {"city": "Tokyo"}),
    "And in Oslo?": ("weather", "get_weather", {"city": "Oslo"}),
    "How long is the train from Paris to Lyon?": ("train", "train_time", {"origin": "Paris", "destination": "Lyon"}),
    "What is 12 times 7?": ("calculator", "calculate", {"a": 12, "op": "multiply", "b": 7}),
    "What is 345 plus 678?": ("calculator", "calculate", {"a": 345, "op": "add", "b": 678}),
    "Will it rain in London today?": ("weather", "get_weather", {"city": "London"}),
    "What is 1000 minus 1?": ("calculator", "calculate", {"a": 1000, "op": "subtract", "b": 1}),
    "What is 100 divided by 8?": ("calculator", "calculate", {"a": 100, "op": "divide", "b": 8}),
}


# ---- running one question --------------------------------------------------------------------

@dataclass
class Step:
    """One agent's turn: its tool call, the result, and the work it cost."""

    agent: str
    call: str = ""
    arguments: dict = field(default_factory=dict)
    result: Any = None
    error: str | None = None
    computed: int = 0  # prompt tokens prefilled
    reused: int = 0  # prompt tokens served from KV already held (session or radix cache)
    decoded: int = 0
    tool_s: float = 0.0
    wall_s: float = 0.0

    def line(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments.items())
        what = f"{self.call}({args})" if self.call else "(no tool call)"
        out = f"error: {self.error}" if self.error else repr(self.result)
        return (f"  {self.agent:<10} {what} -> {out}\n"
                f"  {'':<10} prefill {self.computed} tokens computed + {self.reused} reused from KV, "
                f"{self.decoded} decoded, tool {self.tool_s * 1e3:.2f} ms, {self.wall_s:.2f} s")


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
    words = re.findall(r"[a-z]+|[^\sa-z0-9.?!,']", q)  # words, and signs such as + - * /
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


@dataclass
class Answer:
    question: str
    route: Step
    specialist: Step | None
    wall_s: float

    @property
    def text(self) -> str:
        s = self.specialist
        if s is None or s.error or s.result is None:
            return "(no answer: the tool call failed)"
        bad = unfounded(self.question, s.arguments)
        if bad:
            return (f"(no answer: the question does not say {', '.join(bad)}; it is beyond the 135M model or "
                    "its specialists: --model path/to/model.gguf for a bigger model)")
        return str(s.result)


async def ask(agent, message) -> Step:
    """One turn of `agent`; the work it cost comes from the engine's usage of each model call."""
    t0 = time.perf_counter()
    result = await agent.ask(message, timeout=300)
    step = Step(agent.name.split("/")[0], wall_s=time.perf_counter() - t0,
                computed=sum(u.computed_prompt_tokens for u in result.usage),
                reused=sum(u.cached_tokens for u in result.usage),
                decoded=sum(u.completion_tokens for u in result.usage))
    for m in result.messages:
        for call in m.get("tool_calls", [])[:1]:
            step.call, step.arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
    for r in result.tool_results[:1]:
        step.tool_s = r.duration_s
        if r.is_error:
            step.error = r.content
        else:
            step.result = r.raw
    return step


async def ask_agent(rt, kind: str, thread: str, question: str) -> Step:
    """`question` to the thread's agent of `kind` (activated on first use); a new agent's
    conversation opens with its worked examples."""
    held = rt.actors.get(f"{kind}/{thread}")  # (Runtime.actor names an actor kind/key)
    agent = await rt.actor(kind, thread, lambda _: AGENTS[kind]())
    opening = worked_examples(kind) if held is None or held.stopped else []
    return await ask(agent, opening + [{"role": "user", "content": question}])


async def answer(rt, thread: str, question: str) -> Answer:
    t0 = time.perf_counter()
    r = await ask_agent(rt, "router", thread, question)
    spec = await ask_agent(rt, r.result, thread, question) if r.result in AGENTS else None
    return Answer(question, r, spec, time.perf_counter() - t0)


def check(a: Answer) -> bool:
    """Whether the answer took the expected route, tool and arguments (EXPECTED)."""
    want = EXPECTED.get(a.question)
    s = a.specialist
    return want is not None and s is not None and (a.route.result, s.call, s.arguments) == want


def show(thread: str, a: Answer) -> None:
    print(f"\n[{thread}] {a.question}")
    print(a.route.line())
    if a.specialist is not None:
        print(a.specialist.line())
    mark = "" if a.question not in EXPECTED else "   (as expected)" if check(a) else "   (NOT as expected)"
    print(f"  answer: {a.text}   [{a.wall_s:.2f} s]{mark}")


async def run_demo(lm, threads: dict[str, list[str]] = THREADS, verbose: bool = True) -> list[Answer]:
    answers = []
    async with Engine(lm, EngineConfig(kv_cache_tokens=32768)) as engine, Runtime(engine) as rt:
        # conversations interleave: each thread's first question, then the follow-ups
        order = [(t, i, q) for t, qs in threads.items() for i, q in enumerate(qs)]
        for thread, _, q in sorted(order, key=lambda x: x[1]):
            answers.append(await answer(rt, thread, q))
            if verbose:
                show(thread, answers[-1])
        if verbose:
            st = engine.stats()
            print(f"\nengine: {st.steps} steps; prompt tokens: {st.prompt_submitted} submitted, "
                  f"{st.prompt_computed} computed, {st.prompt_cached} reused from KV "
                  f"(hit rate {st.hit_rate:.0%}); {st.decode_tokens} decoded; "
                  f"speculation acceptance {st.spec_acceptance:.0%}")
        await rt.stop_all()
    return answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lm = load_model(args.model)
    print(f"loaded {lm.source.split('/')[-1]} in {time.perf_counter() - t0:.1f} s; "
          "answers are the tools' results (the model routes and calls, it does not phrase them)")
    answers = anyio.run(run_demo, lm)
    ok = sum(check(a) for a in answers)
    print(f"{ok}/{len(answers)} questions took the expected route, tool and arguments; "
          f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
