"""Agent: an actor behaviour that holds a KV session for its whole life and runs the
model -> tool-call -> tool -> model loop with direct Python calls.

One turn (`handle` / `stream`), on the conversation core (`agentrt/session/conversation.py`):
  1. the new messages are appended to the Conversation as a token delta;
  2. `Conversation.round()` generates into the agent's own session (only the delta is
     prefilled), constrained to the model family's tool-call format when `constrained`
     (tool_choice applies to round 0; later rounds are "auto", the last allowed round "none"),
     streams the parser's events and stops early when no useful output can follow;
  3. a valid call of a `pure` tool starts the moment it validates, while the model still writes
     the next call (pipelined tool execution); the other calls start when the round ends;
     invalid calls and tool errors become tool messages the model can read;
  4. results are appended in call order, back to 2;
  5. a round without tool calls ends the turn with a TurnResult.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio

from agentrt.checks import check_bool, check_int, check_tool_choice
from agentrt.errors import ConfigError
from agentrt.runtime.events import RoundStarted, ToolResultEvent, TurnResult
from agentrt.sampling import SamplingParams
from agentrt.session.conversation import Conversation, RoundEnd
from agentrt.session.overflow import ContextPolicy
from agentrt.session.repeats import CallLimits
from agentrt.toolcall import CallComplete
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG, RESPONSE_CLOSE, RESPONSE_OPEN
from agentrt.tools import Tool, ToolContext, ToolResult, Toolset, run_tool_call
from agentrt.tools.dispatch import unknown_tool_result


@asynccontextmanager
async def _call_group():
    """A task group for a round's tool calls that re-raises the round's own error unwrapped (tool
    calls never raise; a group of one is the engine's typed error, e.g. EngineClosed)."""
    try:
        async with anyio.create_task_group() as tg:
            yield tg
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


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


# the Hermes tags a small model may echo into its answer, and a tag cut off at a line's end
_ECHO_MARKUP = re.compile("|".join(map(re.escape, (OPEN_TAG, CLOSE_TAG, RESPONSE_OPEN, RESPONSE_CLOSE)))
                          + r"|<tool\s*$")


def clean_text(text: str) -> str:
    """Final text without tool-format markup a small model may echo (e.g. `<tool_response>`)."""
    lines = [ln for ln in (_ECHO_MARKUP.sub("", x).strip() for x in text.splitlines()) if ln]
    return "\n".join(dict.fromkeys(lines))  # echoed duplicate lines collapse to one


class Agent:
    def __init__(self, name: str, instructions: str = "", tools: Sequence[Tool | Callable] = (), *,
                 engine=None, settings: GenerationSettings | None = None, max_tool_rounds: int = 8,
                 tool_choice: Any = "auto", constrained: bool = True, parallel_tool_calls: bool = True,
                 deps: Any = None, stop_at_tools: Sequence[str] = (), context_policy: ContextPolicy | None = None,
                 call_limits: CallLimits | None = None):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Agent name must be a non-empty str, got {name!r}")
        if not isinstance(instructions, str):
            raise ConfigError(f"Agent {name!r}: instructions must be a str (the system prompt), "
                              f"got {type(instructions).__name__}")
        if isinstance(tools, (str, bytes, Tool)) or callable(tools) or not isinstance(tools, Iterable):
            raise ConfigError(f"Agent {name!r}: tools must be a list of tools or functions, got "
                              f"{type(tools).__name__}; wrap a single one: tools=[f]")
        if engine is not None and not callable(getattr(engine, "open_session", None)):
            raise ConfigError(f"Agent {name!r}: engine must be an Engine (or None: the Runtime's), "
                              f"got {type(engine).__name__}")
        if settings is not None and not isinstance(settings, SamplingParams):
            raise ConfigError(f"Agent {name!r}: settings must be a GenerationSettings (SamplingParams) or None, "
                              f"got {type(settings).__name__}; e.g. GenerationSettings(max_tokens=256)")
        max_tool_rounds = check_int(f"Agent {name!r}: max_tool_rounds", max_tool_rounds, min=0)
        self.name, self.instructions, self.engine = name, instructions, engine
        self.tools = {t.name: t for t in Toolset(tools)}  # as Toolset: a duplicate name raises ToolDefinitionError
        check_tool_choice(tool_choice, tuple(self.tools))
        self.settings = settings or GenerationSettings()
        self.max_tool_rounds, self.tool_choice = max_tool_rounds, tool_choice
        self.constrained = check_bool(f"Agent {name!r}: constrained", constrained)
        self.parallel_tool_calls = check_bool(f"Agent {name!r}: parallel_tool_calls", parallel_tool_calls)
        self.deps = deps
        if isinstance(stop_at_tools, (str, bytes)) or not isinstance(stop_at_tools, Iterable):
            raise ConfigError(f"Agent {name!r}: stop_at_tools must be a list of tool names, got "
                              f"{type(stop_at_tools).__name__}; wrap a single one: stop_at_tools=[name]")
        stop_at_tools = tuple(stop_at_tools)
        unknown = set(stop_at_tools) - set(self.tools)
        if unknown:
            raise ConfigError(f"stop_at_tools names tools the agent does not have: {sorted(unknown)}")
        self.stop_at_tools = tuple(stop_at_tools)  # e.g. handoffs: the turn ends once one has run
        self.session = None
        self.conversation: Conversation | None = None
        self.context_policy = context_policy if context_policy is not None else ContextPolicy()
        if not isinstance(self.context_policy, ContextPolicy):
            raise ConfigError(f"context_policy must be a ContextPolicy, got {type(context_policy).__name__}")
        self.call_limits = call_limits if call_limits is not None else CallLimits()  # repeats / too many calls
        if not isinstance(self.call_limits, CallLimits):
            raise ConfigError(f"call_limits must be a CallLimits, got {type(call_limits).__name__}")
        self._call_ids = itertools.count(1)

    def fresh(self, name: str | None = None) -> "Agent":
        """A new agent with the same definition (and `name`, default this one's) and no state (one
        per LangGraph thread, say)."""
        return Agent(self.name if name is None else name, self.instructions, list(self.tools.values()),
                     engine=self.engine, settings=self.settings, max_tool_rounds=self.max_tool_rounds,
                     tool_choice=self.tool_choice,
                     constrained=self.constrained, parallel_tool_calls=self.parallel_tool_calls, deps=self.deps,
                     stop_at_tools=self.stop_at_tools, context_policy=self.context_policy, call_limits=self.call_limits)

    async def fork(self, name: str) -> "Agent":
        """A new agent `name` with this one's definition and a fork of its conversation
        (`Conversation.fork`: the KV pages are shared copy-on-write), not started: spawn it (or
        use `Runtime.fork`). Fork an agent between turns: the fork holds what the conversation
        holds now."""
        if self.conversation is None:
            raise ConfigError(f"agent {self.name!r} has no conversation yet: spawn it before forking it")
        child = self.fresh(name)
        child.conversation = await self.conversation.fork(tag=name)
        child.session = child.conversation.session
        return child

    # ---- actor lifecycle --------------------------------------------------------------
    async def start(self, ctx) -> None:
        self.engine = self.engine or ctx.runtime.engine
        if self.engine is None:
            raise ConfigError(f"agent {self.name!r} has no engine: pass engine= or give the Runtime one")
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
        self.conversation = Conversation(self.engine, tools=self._schemas(), session=self.session,
                                         policy=self.context_policy)
        if self.instructions:
            self.conversation.append([{"role": "system", "content": self.instructions}])

    @property
    def messages(self) -> list[dict]:
        return self.conversation.messages

    @property
    def tokens(self) -> list[int]:
        """What the agent's session KV holds (or will, once the next round prefills)."""
        return self.conversation.tokens

    def _schemas(self) -> list[dict] | None:
        return [t.openai_schema() for t in self.tools.values()] or None

    # ---- one turn ----------------------------------------------------------------------
    async def handle(self, message: Any, ctx) -> TurnResult:
        result = None
        async for ev in self.stream(message, ctx):
            result = ev
        return result

    async def stream(self, message: Any, ctx) -> AsyncIterator[Any]:
        await self.conversation.add(as_messages(message))
        turn: list[dict] = []
        results: list[ToolResult] = []
        usage, text = [], ""
        for rnd in range(self.max_tool_rounds + 1):
            yield RoundStarted(rnd, len(self.tokens))
            base = next(self._call_ids)

            def call_id(index: int, base: int = base) -> str:
                return f"call_{self.name}_{base + index}"
            end, done = None, {}
            async with _call_group() as tg:  # pure calls start mid-round
                async for ev in self.conversation.round(
                        self.settings, tool_choice=self._choice(rnd), parallel_tool_calls=self.parallel_tool_calls,
                        constrained=self.constrained, call_id=call_id, content=clean_text, limits=self.call_limits):
                    if isinstance(ev, RoundEnd):
                        end = ev
                        self._start_calls(tg, [c for c in ev.calls if c.index not in done], call_id, done)
                        continue
                    if isinstance(ev, CallComplete) and self._is_pure(ev.name):
                        self._start_calls(tg, [ev], call_id, done)
                    yield ev
            self._skip_ids(end)
            if end.usage is not None:
                usage.append(end.usage)
            text = end.message["content"]
            turn.append(end.message)
            if not end.calls and not end.invalid:
                yield TurnResult(text, turn, results, usage, rnd + 1)
                return
            round_results = self._gather(end, done, call_id)
            for r in round_results:
                yield ToolResultEvent(r)
            results += round_results
            tool_msgs = [{"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.content}
                         for r in round_results]
            turn += tool_msgs
            await self.conversation.add(tool_msgs)  # big results: cut, and encoded off the event loop
            stopper = next((r.name for r in round_results if r.name in self.stop_at_tools and not r.is_error), None)
            if stopper is not None:
                yield TurnResult(text, turn, results, usage, rnd + 1, stopped_by_tool=stopper)
                return
        yield TurnResult(text, turn, results, usage, self.max_tool_rounds + 1, stopped_by_round_limit=True)

    def _choice(self, rnd: int) -> Any:
        if not self.tools or rnd >= self.max_tool_rounds:
            return "none"
        return self.tool_choice if rnd == 0 else "auto"

    def _is_pure(self, name: str) -> bool:
        t = self.tools.get(name)
        return t is not None and t.pure

    def mark(self) -> tuple[int, Any]:
        """Where the agent stands between turns (messages held, call-id counter), for `rewind`."""
        return len(self.conversation.messages), copy.copy(self._call_ids)

    def rewind(self, mark: tuple[int, Any]) -> None:
        """Forget a turn that failed after `mark` (its replica died, say): the messages it added
        and the call ids it used, so asking again continues as if it had never run."""
        count, ids = mark
        self.conversation.rewind(count)
        self._call_ids = copy.copy(ids)

    def _skip_ids(self, end: RoundEnd) -> None:
        """Call ids are base + parser index: keep the counter past this round's verdicts."""
        for _ in range(len(end.calls) + len(end.invalid) - 1):
            next(self._call_ids)

    def _start_calls(self, tg, calls, call_id: Callable[[int], str], done: dict) -> None:
        ctx = ToolContext(agent=self.name, deps=self.deps)
        for c in calls:
            t = self.tools.get(c.name)
            if t is None:
                done[c.index] = unknown_tool_result(c.name, call_id(c.index), list(self.tools))
                continue
            done[c.index] = None  # started

            async def run(c=c, t=t) -> None:
                done[c.index] = await run_tool_call(t, c.arguments, call_id=call_id(c.index), context=ctx,
                                                    limiter=self._limiter)
            tg.start_soon(run)

    @staticmethod
    def _gather(end: RoundEnd, done: dict, call_id: Callable[[int], str]) -> list[ToolResult]:
        """The round's results in call order; invalid calls become error results."""
        out: dict[int, ToolResult] = dict(done)
        for c in end.invalid:
            out[c.index] = ToolResult(call_id=call_id(c.index), name=c.name or "?", is_error=True, raw=None,
                                      content=f"invalid tool call: {c.reason}", attempts=0, duration_s=0.0)
        return [out[i] for i in sorted(out)]
