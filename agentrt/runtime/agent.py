"""Agent: an actor behaviour that holds a KV session for its whole life and runs the
model -> tool-call -> tool -> model loop with direct Python calls.

One turn (`handle` / `stream`):
  1. the new messages are appended to the conversation as a token delta (ChatFormat);
  2. the model generates into the agent's own session (only the delta is prefilled), with a
     grammar constraint for the tools when `constrained` (tool_choice applies to round 0;
     later rounds are "auto", and the last allowed round is "none");
  3. the decoded text streams through ToolCallParser: text, call started, argument deltas,
     call complete / invalid; decode stops early when the parser says no more useful output;
  4. the generated tokens are appended verbatim (they are what the session's KV holds);
  5. valid calls run concurrently (sync tools in worker threads); invalid calls and tool
     errors become tool messages the model can read; results are appended, back to 2;
  6. a round without tool calls ends the turn with a TurnResult.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from agentrt.errors import ConfigError
from agentrt.model.tokenizer import IncrementalDecoder
from agentrt.runtime.events import RoundStarted, ToolResultEvent, TurnResult
from agentrt.sampling import SamplingParams
from agentrt.session.chat import ChatFormat
from agentrt.toolcall import CallComplete, CallInvalid, TextDelta, ToolCallParser
from agentrt.tools import Tool, ToolContext, ToolResult, run_tool_calls


# An agent's generation settings are the engine's SamplingParams (one validated definition).
GenerationSettings = SamplingParams


def as_messages(message: Any) -> list[dict]:
    """str -> one user message; a dict -> [it]; a list of dicts -> as is."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    if isinstance(message, dict):
        return [message]
    if isinstance(message, (list, tuple)) and all(isinstance(m, dict) for m in message):
        return list(message)
    raise ConfigError("an agent takes a str, a message dict or a list of message dicts")


_ECHO_MARKUP = re.compile(r"</?tool_response>|</?tool_call>|<tool\s*$")


def clean_text(text: str) -> str:
    """Final text without tool-format markup a small model may echo (e.g. `<tool_response>`)."""
    lines = [ln for ln in (_ECHO_MARKUP.sub("", x).strip() for x in text.splitlines()) if ln]
    return "\n".join(dict.fromkeys(lines))  # echoed duplicate lines collapse to one


class _TextOnly:
    """The parser's interface for an agent without tools: every piece is text."""

    should_stop = False

    def feed(self, text: str) -> list:
        return [TextDelta(text)] if text else []

    def close(self) -> list:
        return []


class Agent:
    def __init__(self, name: str, instructions: str = "", tools: Sequence[Tool | Callable] = (), *,
                 engine=None, settings: GenerationSettings | None = None, max_tool_rounds: int = 8,
                 tool_choice: Any = "auto", constrained: bool = True, parallel_tool_calls: bool = True,
                 deps: Any = None, stop_at_tools: Sequence[str] = ()):
        if max_tool_rounds < 0:
            raise ConfigError("max_tool_rounds must be >= 0")
        self.name, self.instructions, self.engine = name, instructions, engine
        self.tools = {t.name: t for t in (x if isinstance(x, Tool) else Tool.from_function(x) for x in tools)}
        self.settings = settings or GenerationSettings()
        self.max_tool_rounds, self.tool_choice = max_tool_rounds, tool_choice
        self.constrained, self.parallel_tool_calls, self.deps = constrained, parallel_tool_calls, deps
        unknown = set(stop_at_tools) - set(self.tools)
        if unknown:
            raise ConfigError(f"stop_at_tools names tools the agent does not have: {sorted(unknown)}")
        self.stop_at_tools = tuple(stop_at_tools)  # e.g. handoffs: the turn ends once one has run
        self.session = None
        self.messages: list[dict] = []
        self.tokens: list[int] = []
        self._call_ids = itertools.count(1)

    def fresh(self) -> "Agent":
        """A new agent with the same definition and no state (one per LangGraph thread, say)."""
        return Agent(self.name, self.instructions, list(self.tools.values()), engine=self.engine,
                     settings=self.settings, max_tool_rounds=self.max_tool_rounds, tool_choice=self.tool_choice,
                     constrained=self.constrained, parallel_tool_calls=self.parallel_tool_calls, deps=self.deps,
                     stop_at_tools=self.stop_at_tools)

    # ---- actor lifecycle --------------------------------------------------------------
    async def start(self, ctx) -> None:
        self.engine = self.engine or ctx.runtime.engine
        if self.engine is None:
            raise ConfigError(f"agent {self.name!r} has no engine: pass engine= or give the Runtime one")
        self.fmt = ChatFormat(self.engine.tokenizer)
        self._grammars = ctx.runtime.grammars() if self.constrained and self.tools else None
        self._limiter = ctx.runtime.tool_limiter
        if self.session is None or ctx.reset_state:
            await self._reset()

    async def stop(self, ctx, restarting: bool) -> None:
        """The session is released when the agent stops, and on a restart that resets it."""
        if self.session is not None and not (restarting and self._keeps_session(ctx)):
            await self.session.close()
            self.session = None

    def _keeps_session(self, ctx) -> bool:
        return ctx.runtime.actors[ctx.name].supervision.session == "keep"

    async def _reset(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = await self.engine.open_session(tag=self.name)
        self.messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        self.tokens = self.fmt.encode(self.messages, tools=self._schemas(), add_generation_prompt=False) \
            if self.messages else []

    def _schemas(self) -> list[dict] | None:
        return [t.openai_schema() for t in self.tools.values()] or None

    # ---- one turn ----------------------------------------------------------------------
    async def handle(self, message: Any, ctx) -> TurnResult:
        result = None
        async for ev in self.stream(message, ctx):
            result = ev
        return result

    async def stream(self, message: Any, ctx) -> AsyncIterator[Any]:
        self._append(as_messages(message))
        turn: list[dict] = []
        results: list[ToolResult] = []
        usage, text = [], ""
        for rnd in range(self.max_tool_rounds + 1):
            choice = self._choice(rnd)
            yield RoundStarted(rnd, len(self.tokens))
            calls, invalid, text_parts = [], [], []
            async for ev in self._generate(choice, usage):
                if isinstance(ev, TextDelta):
                    text_parts.append(ev.text)
                elif isinstance(ev, CallComplete):
                    calls.append(ev)
                elif isinstance(ev, CallInvalid):
                    invalid.append(ev)
                yield ev
            text = clean_text("".join(text_parts))
            ids = [f"call_{self.name}_{next(self._call_ids)}" for _ in calls + invalid]
            turn.append(self._assistant_message(text, calls, invalid, ids))
            if not calls and not invalid:
                yield TurnResult(text, turn, results, usage, rnd + 1)
                return
            round_results = await self._run_calls(calls, invalid, ids)
            for r in round_results:
                yield ToolResultEvent(r)
            results += round_results
            tool_msgs = [{"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.content}
                         for r in round_results]
            turn += tool_msgs
            self._append(tool_msgs)
            stopper = next((r.name for r in round_results if r.name in self.stop_at_tools and not r.is_error), None)
            if stopper is not None:
                yield TurnResult(text, turn, results, usage, rnd + 1, stopped_by_tool=stopper)
                return
        yield TurnResult(text, turn, results, usage, self.max_tool_rounds + 1, stopped_by_round_limit=True)

    def _choice(self, rnd: int) -> Any:
        if not self.tools or rnd >= self.max_tool_rounds:
            return "none"
        return self.tool_choice if rnd == 0 else "auto"

    def _append(self, msgs: list[dict]) -> None:
        """Append messages as a token delta: the past is never re-rendered or re-tokenized."""
        self.tokens += self.fmt.encode_delta(self.messages, msgs, tools=self._schemas())
        self.messages += msgs

    async def _generate(self, choice: Any, usage: list) -> AsyncIterator[Any]:
        constraint = None
        if self._grammars is not None and choice != "none":
            constraint = self._grammars.for_tools(self._schemas(), choice,
                                                  parallel_tool_calls=self.parallel_tool_calls)
        # tool_choice "none" (and the last allowed round) calls nothing: call-like text stays text
        parser = ToolCallParser(self._schemas(), wrapper="hermes", parallel_calls=self.parallel_tool_calls) \
            if self.tools and choice != "none" else _TextOnly()
        dec = IncrementalDecoder(self.engine.tokenizer, skip_special=True)
        gen: list[int] = []
        stream = self.engine.generate(self.tokens, self.settings, session=self.session,
                                      constraint=constraint)
        async with aclosing(stream) as s:
            async for ev in s:
                for tok in ev.token_ids:
                    gen.append(tok)
                    for pe in parser.feed(dec.push(tok)):
                        yield pe
                    if parser.should_stop:
                        break
                if ev.usage is not None:
                    usage.append(ev.usage)
                if parser.should_stop:
                    break
        for pe in parser.feed(dec.flush()) + parser.close():
            yield pe
        # the session's KV holds exactly these tokens: append them, closed as a finished turn
        self.tokens += self.fmt.encode_assistant_tokens(gen)

    def _assistant_message(self, text, calls, invalid, ids) -> dict:
        msg: dict = {"role": "assistant", "content": text}
        tc = [{"id": i, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
              for i, c in zip(ids, calls)]
        if tc:
            msg["tool_calls"] = tc
        self.messages.append(msg)
        return msg

    async def _run_calls(self, calls, invalid, ids) -> list[ToolResult]:
        ctx = ToolContext(agent=self.name, deps=self.deps)
        batch = [(self.tools.get(c.name), c.name, c.arguments, i) for c, i in zip(calls, ids)]
        results = await run_tool_calls(batch, context=ctx, limiter=self._limiter, available=list(self.tools))
        for c, i in zip(invalid, ids[len(calls):]):
            results.append(ToolResult(call_id=i, name=c.name or "?", is_error=True, raw=None,
                                      content=f"invalid tool call: {c.reason}", attempts=0, duration_s=0.0))
        return results
