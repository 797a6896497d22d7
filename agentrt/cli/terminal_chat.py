"""`agentrt chat`: a terminal chat with one agent; its tool calls and results are shown as they run.

The agent keeps one KV session: each turn prefills only the new message (the usage line says how
many prompt tokens came from KV already held). Tools offered by default: a calculator and a
clock (`--no-tools` for none). The embedded 135M model answers simple questions, but on its
own it rarely decides to call a tool: with `--tool-choice required` every message starts with a
tool call, one per message, whose result is the answer; a bigger GGUF decides for itself and
phrases answers from results.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Literal

import anyio

from agentrt import Agent, Engine, Runtime, SamplingParams, tool
from agentrt.runtime.turn_events import ToolResultEvent, TurnResult
from agentrt.toolcall import CallComplete, CallInvalid, TextDelta

_OPS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b,
        "divided_by": lambda a, b: a / b}


@tool
def calculate(a: float, op: Literal["plus", "minus", "times", "divided_by"], b: float) -> str:
    """Arithmetic on two numbers.

    Args:
        a: the first number
        op: the operation
        b: the second number
    """
    if op == "divided_by" and b == 0:
        return "cannot divide by zero"
    value = _OPS[op](a, b)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


@tool
def current_time() -> str:
    """The current local date and time."""
    return dt.datetime.now().strftime("%A %d %B %Y, %H:%M")


async def _lines():
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = await anyio.to_thread.run_sync(lambda: input("you> ") if interactive else sys.stdin.readline())
        except EOFError:
            return
        if not interactive and line == "":
            return
        line = line.strip()
        if line in ("exit", "quit", "/exit", "/quit"):
            return
        if line:
            if not interactive:
                print(f"you> {line}")
            yield line


async def chat(lm, engine_config, args) -> None:
    tools = [] if args.no_tools else [calculate, current_time]
    required = bool(tools) and args.tool_choice == "required"
    # required: one call per message, and its result is the answer (a 135M model cannot phrase one)
    agent = Agent("chat", args.system or "", tools, settings=SamplingParams(max_tokens=args.max_tokens),
                  tool_choice="required" if required else "auto", parallel_tool_calls=not required,
                  stop_at_tools=[t.name for t in tools] if required else ())
    print(f"agentrt chat on {lm.source} ({'no tools' if not tools else 'tools: calculate, current_time'}); "
          "an empty line or `exit` ends it.", file=sys.stderr)
    async with Engine(lm, engine_config) as engine, Runtime(engine) as rt:
        ref = await rt.spawn(agent, name="chat")
        async for line in _lines():
            await _turn(ref, line)


async def _turn(ref, line: str) -> None:
    label = True  # "assistant> " is printed before the first text of each model call
    async for ev in ref.ask_stream(line):
        if isinstance(ev, TextDelta):
            if label and not ev.text.strip():
                continue  # leading whitespace before a call or an answer
            print(f"assistant> {ev.text.lstrip()}" if label else ev.text, end="", flush=True)
            label = False
        elif isinstance(ev, CallComplete):
            args = ", ".join(f"{k}={v!r}" for k, v in ev.arguments.items())
            print(f"{'' if label else chr(10)}  [call {ev.name}({args})]", flush=True)
            label = True
        elif isinstance(ev, CallInvalid):
            print(f"{'' if label else chr(10)}  [invalid call: {ev.reason}]", flush=True)
            label = True
        elif isinstance(ev, ToolResultEvent):
            print(f"  [-> {ev.result.content}]", flush=True)
        elif isinstance(ev, TurnResult):
            prompt = sum(u.prompt_tokens for u in ev.usage)
            cached = sum(u.cached_tokens for u in ev.usage)
            gen = sum(u.completion_tokens for u in ev.usage)
            print(f"{'' if label else chr(10)}  [{ev.rounds} model call(s): {prompt} prompt tokens, {cached} from KV "
                  f"already held, {gen} generated]", flush=True)
