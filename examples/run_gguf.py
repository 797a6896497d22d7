"""Run a tool-calling agent on any GGUF model and see what it does with two tools.

    python examples/run_gguf.py                              (the embedded SmolLM2-135M)
    python examples/run_gguf.py --model path/to/model.gguf
    python examples/run_gguf.py --model path/to/model.gguf -q "What is 7 times 6?" -q "Weather in Oslo?"

For each question a fresh agent (its own KV session) must call one of its tools
(`tool_choice="required"`; the call is constrained by a grammar, so it is always well formed),
the tool runs, and the model writes the answer from the tool's result. The program prints the
call with its arguments, the tool's result and the answer, and it checks what it can check
without knowing the right answer:
  * every argument must come from the question (a city the question names, a number it
    contains): an argument the question does not contain was made up;
  * the answer must state the numbers the tool returned, in words of its own (not the tool's
    result repeated), without leftover tool markup or repetition loops.
When a check fails, it says that the model is too small for the task (choosing the call, or
writing the answer) instead of printing its output (`--verbose` prints it anyway).

The embedded SmolLM2-135M passes none of the three default questions: it makes two of the three
calls right (for the weather in Paris it calls `calculate`) and then repeats the tool's result
instead of writing an answer. That is what the program is for: it says so, and names the size
of model the task needs (an instruct model of 1B parameters or more, e.g. a Qwen2.5-1.5B-Instruct
Q4_K_M GGUF, passed with `--model`). The other examples show what the 135M model can do when
the program, not the model, writes the answer (the tool's result is the answer there).
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Annotated, Literal

import anyio
from pydantic import Field

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, load_model, tool
from agentrt.runtime.turn_events import CallComplete, CallInvalid, ToolResultEvent, TurnResult

WEATHER = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (-3, "snowing"), "london": (12, "raining")}


@tool
def get_weather(city: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z .'-]{0,40}$")]) -> dict:
    """Current weather in a city.

    Args:
        city: the city, e.g. "Paris"
    """
    temp, sky = WEATHER.get(city.strip().lower(), (20, "clear"))
    return {"city": city, "temperature_c": temp, "sky": sky}


@tool
def calculate(a: float, op: Literal["+", "-", "*", "/"], b: float) -> dict:
    """Compute `a op b`.

    Args:
        a: the first number
        op: the operation: + plus, - minus, * times, / divided by
        b: the second number
    """
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]
    return {"expression": f"{a:g} {op} {b:g}", "result": round(value, 6)}


QUESTIONS = ["What is the weather in Paris?", "How cold is it in Oslo?", "What is 23 times 19?"]
INSTRUCTIONS = "You answer with the tools. After the tool result, answer in one short sentence."


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def made_up_arguments(question: str, arguments: dict) -> list[str]:
    """Arguments the question does not contain (operators and other enum values excepted)."""
    q = question.lower()
    numbers = {float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", q)}
    bad = []
    for name, value in arguments.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            if float(value) not in numbers:
                bad.append(f"{name}={value!r}")
        elif isinstance(value, str) and len(value) > 1 and value.strip().lower() not in q:
            bad.append(f"{name}={value!r}")
    return bad


def numbers_in(value) -> list[str]:
    """The numbers of a tool result, as text (each one must appear in the answer)."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [_number(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in numbers_in(v)]
    return []


def answer_problem(text: str, tool_result, tool_content: str = "") -> str | None:
    """Why `text` is not a usable answer for `tool_result` (sent to the model as `tool_content`),
    or None."""
    if not text.strip():
        return "it wrote no answer"
    if " ".join(text.split()) == " ".join(tool_content.split()) or text.lstrip().startswith(("{", "[")):
        return "it repeated the tool's result instead of writing an answer"
    if re.search(r"<\s*/?\s*t", text) or "tool_call" in text or "tool_response" in text:
        return "it wrote tool-call markup instead of an answer"
    if re.search(r"(.{3,}?)\1{3,}", text):
        return "it fell into a repetition loop"
    missing = [n for n in numbers_in(tool_result) if n not in text.replace(",", "")]
    if missing:
        return f"its answer does not state the tool's result ({', '.join(missing)} missing)"
    return None


async def run_question(rt, question: str, index: int, max_tokens: int, verbose: bool) -> bool:
    """One question with a fresh agent; True when the call and the answer pass the checks."""
    print(f"\nuser: {question}")
    agent = await rt.spawn(Agent(
        "assistant", INSTRUCTIONS, [get_weather, calculate], tool_choice="required", max_tool_rounds=1,
        parallel_tool_calls=False, settings=SamplingParams(max_tokens=max_tokens)), name=f"assistant-{index}")
    t0, calls, results, final = time.perf_counter(), [], [], None
    try:
        async for ev in agent.ask_stream(question):
            if isinstance(ev, CallComplete):
                calls.append(ev)
                args = ", ".join(f"{k}={v!r}" for k, v in ev.arguments.items())
                print(f"  call    {ev.name}({args})")
            elif isinstance(ev, CallInvalid):
                print(f"  invalid call: {ev.reason}")
            elif isinstance(ev, ToolResultEvent):
                results.append(ev.result)
                print(f"  result  {'error: ' if ev.result.is_error else ''}{ev.result.content}")
            elif isinstance(ev, TurnResult):
                final = ev
    finally:
        await agent.stop()
    wall = time.perf_counter() - t0

    good = [r for r in results if not r.is_error]
    made_up = [m for c in calls for m in made_up_arguments(question, c.arguments)]
    problem = answer_problem(final.text, good[0].raw, good[0].content) if good else None
    if not good:
        print("  => the tool call failed: this model is too small to make this call; no answer printed")
    elif made_up:
        print(f"  => the call has arguments the question does not contain ({', '.join(made_up)}): this "
              "model is too small to choose the call for this question; no answer printed")
    elif problem is not None:
        print(f"  => the call is right but no answer is printed: {problem}. This model is too small to "
              "write the answer from a tool result; the tool's result above is the answer")
    else:
        print(f"  answer  {final.text}")
    if verbose and (not good or made_up or problem is not None):
        print(f"  (the model's text: {final.text!r})")
    ok = bool(good) and not made_up and problem is None
    print(f"  [{wall:.2f} s]")
    return ok


async def main(source: str, questions: list[str], max_tokens: int, verbose: bool) -> None:
    t0 = time.perf_counter()
    lm = load_model(source)
    c = lm.config
    print(f"loaded {lm.source.split('/')[-1]} ({c.arch}, {c.num_layers} layers, hidden {c.hidden_size}) "
          f"in {time.perf_counter() - t0:.1f} s")
    if c.hidden_size < 1024:
        print("note: a model this small often fails at tool calling; each step is checked below")
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
        passed = [await run_question(rt, q, i, max_tokens, verbose) for i, q in enumerate(questions)]
    print(f"\n{sum(passed)}/{len(passed)} questions answered with a checked call and answer")
    if not all(passed):
        print(f"{lm.source.split('/')[-1]} is too small for some of these tasks (see the => lines); "
              "try a bigger instruct model (1B parameters or more): --model path/to/model.gguf")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file (or an HF directory, or an embedded name)")
    ap.add_argument("-q", "--question", action="append", help="a question (repeatable); default: three examples")
    ap.add_argument("--max-tokens", type=int, default=96, help="tokens per model call at most")
    ap.add_argument("--verbose", action="store_true", help="also print answers that fail the checks")
    args = ap.parse_args()
    anyio.run(main, args.model, args.question or QUESTIONS, args.max_tokens, args.verbose)
