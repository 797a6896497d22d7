"""Agent: an actor behaviour that holds a KV session and runs the model -> tool-call -> tool ->
model loop with direct Python calls. While idle it keeps its session unless the engine runs out
of session ids: then the runtime passivates it (runtime/leases.py) and its next turn activates
it on a new session, its history served from the prefix cache or the tier, or prefilled again.

One turn (`handle` / `stream`), on the conversation core (`agentrt/conversation/conversation.py`):
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
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import fields, replace
from typing import Any, cast

import anyio

from agentrt import tracing
from agentrt.conversation import timeline
from agentrt.conversation.call_ids import call_id as make_call_id
from agentrt.conversation.call_ids import scoped
from agentrt.conversation.conversation import Conversation, RoundEnd
from agentrt.engine.like import EngineLike, SessionLike
from agentrt.errors import ActorError, ConfigError, PoolExhausted
from agentrt.runtime import persist
from agentrt.runtime.agent_text import as_messages, clean_text
from agentrt.runtime.failed_calls import FailedCalls
from agentrt.runtime.leases import SessionLeases
from agentrt.runtime.spec import AgentSpec
from agentrt.runtime.turn_events import RoundStarted, ToolResultEvent, TurnResult
from agentrt.sampling import SamplingParams
from agentrt.toolcall import CallComplete
from agentrt.tools import Tool, ToolContext, ToolResult, run_tool_call
from agentrt.tools.dispatch import unknown_tool_result
from agentrt.workflow import current_task


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
_SPEC_FIELDS = frozenset(f.name for f in fields(AgentSpec))


class Agent:
    """An agent actor's behaviour: its definition (`spec`, a frozen AgentSpec) and the state it
    gathers (session, conversation, call ids). The definition's fields read through:
    `agent.settings` is `agent.spec.settings`."""

    def __init__(self, name: str, instructions: str = "", tools: Iterable[Tool | Callable] = (), **definition: Any):
        """`definition`: AgentSpec's keyword fields (engine, settings, tool_choice, ...), checked there."""
        # (AgentSpec takes tools as any iterable of Tools or functions and holds them as a tuple of Tool)
        self.spec = AgentSpec(name, instructions, cast(tuple[Tool, ...], tools), **definition)
        # where it runs: the spec's engine, else the Runtime's (set at start) or a replica a cluster picks
        self.engine: EngineLike | None = self.spec.engine
        self.tools = {t.name: t for t in self.spec.tools}
        self.session: SessionLike | None = None
        self.conversation: Conversation | None = None
        self._call_ids = itertools.count(1)
        self._leases: SessionLeases | None = None  # the Runtime's session leases (runtime/leases.py), set at start
        self._limiter: anyio.CapacityLimiter | None = None  # the Runtime's sync-tool threads, set at start

    @classmethod
    def from_spec(cls, spec: AgentSpec) -> "Agent":
        """A new agent (no state yet) running `spec`; change one with `dataclasses.replace`."""
        if not isinstance(spec, AgentSpec):
            raise ConfigError(f"from_spec takes an AgentSpec, got {type(spec).__name__}")
        return cls(**{f.name: getattr(spec, f.name) for f in fields(spec)})

    def __getattr__(self, name: str) -> Any:
        # only called for names the agent does not hold itself: the definition's fields
        spec = self.__dict__.get("spec")
        if spec is not None and name in _SPEC_FIELDS:
            return getattr(spec, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def fresh(self, name: str | None = None) -> "Agent":
        """A new agent with the same definition (and `name`, default this one's; on the engine this
        one runs on) and no state (one per LangGraph thread, say)."""
        return Agent.from_spec(replace(self.spec, name=self.spec.name if name is None else name, engine=self.engine))

    async def fork(self, name: str) -> "Agent":
        """A new agent `name` with this one's definition and a fork of its conversation
        (`Conversation.fork`: the KV pages are shared copy-on-write), not started: spawn it (or
        use `Runtime.fork`). Fork an agent between turns: the fork holds what the conversation
        holds now."""
        if self.conversation is None:
            raise ConfigError(f"agent {self.spec.name!r} has no conversation yet: spawn it before forking it")
        child = self.fresh(name)
        while True:
            try:
                child.conversation = await self.conversation.fork(tag=name, timeout=0.0)
                break
            except PoolExhausted:  # no id for the fork: passivate an idle agent (maybe this one)
                leases = self._leases
                if leases is None or not await leases.passivate_one(self.engine):
                    raise
        child.session = child.conversation.session
        return child

    # ---- actor lifecycle --------------------------------------------------------------
    async def start(self, ctx) -> None:
        self.engine = self.engine or ctx.runtime.engine
        if self.engine is None:
            raise ConfigError(f"agent {self.spec.name!r} has no engine: pass engine= or give the Runtime one")
        self._limiter = ctx.runtime.tool_limiter
        self._leases = leases = ctx.runtime.sessions
        if self.conversation is None or ctx.reset_state:
            await self._reset(resume=not ctx.reset_state)
        await leases.acquire(self)  # a session now (passivating an idle agent if ids ran out)
        leases.release(self)

    async def stop(self, ctx, restarting: bool) -> None:
        """The session is released when the agent stops, and on a restart that resets it."""
        if not (restarting and self._keeps_session(ctx)):
            if self._leases is not None:
                self._leases.forget(self)
            if self.session is not None:
                await self.passivate()

    def attach(self, session: SessionLike) -> None:
        """Run on `session` from now on (a new one after passivation, or a moved one)."""
        self.session = self._conversation().session = session

    def _conversation(self) -> Conversation:
        """The conversation, which exists from the agent's start on."""
        if self.conversation is None:
            raise ActorError(f"agent {self.spec.name!r} has no conversation yet: spawn it first")
        return self.conversation

    def _runtime_parts(self) -> tuple[EngineLike, SessionLeases, anyio.CapacityLimiter]:
        """The engine, session leases and tool threads it runs with, set at its start."""
        if self.engine is None or self._leases is None or self._limiter is None:
            raise ActorError(f"agent {self.spec.name!r} has not started: spawn it on a Runtime")
        return self.engine, self._leases, self._limiter

    async def passivate(self) -> None:
        """Close the session between turns; the conversation keeps the history for the next one.
        (The closed session's KV goes to the prefix cache, keyed by its tokens.)"""
        session, self.session = self.session, None
        if self.conversation is not None:
            self.conversation.session = None
        if session is not None:
            await session.close()

    def _keeps_session(self, ctx) -> bool:
        return ctx.runtime.actors[ctx.name].supervision.session == "keep"

    @property
    def state_key(self) -> str:
        """The key its conversation and session are kept under in the engine's state store."""
        return persist.agent_key(self.spec.name)

    async def _reset(self, resume: bool = False) -> None:
        """A new conversation; with `resume`, the one the engine's state store kept under the
        agent's name, if any (runtime/persist.py), else it is forgotten there too."""
        await self.passivate()  # (a new conversation: nothing of the old session is reused)
        engine = self._runtime_parts()[0]
        self.conversation = conversation = Conversation(
            engine, tools=self.spec.tool_schemas(), policy=self.spec.context_policy, adapter=self.spec.adapter)
        saved = await persist.load(engine, self.spec.name) if resume else None
        if not resume:
            await persist.forget(engine, self.spec.name)
        if saved:
            persist.resume(conversation, saved, self.spec.instructions)
            self._call_ids = itertools.count(int(saved["next_call_id"]))
        elif self.spec.instructions:
            conversation.append([{"role": "system", "content": self.spec.instructions}])

    @property
    def messages(self) -> list[dict]:
        return self._conversation().messages

    @property
    def tokens(self) -> list[int]:
        """What the agent's session KV holds (or will, once the next round prefills)."""
        return self._conversation().tokens

    # ---- one turn ----------------------------------------------------------------------
    async def handle(self, message: Any, ctx) -> TurnResult:
        result = None
        async for ev in self.stream(message, ctx):
            result = ev
        if not isinstance(result, TurnResult):  # (a turn's last event is its TurnResult)
            raise ActorError(f"agent {self.spec.name!r}: the turn ended without a result")
        return result

    async def stream(self, message: Any, ctx) -> AsyncIterator[Any]:
        messages = as_messages(message)
        engine, leases, _ = self._runtime_parts()
        span = tracing.agent_turn(self.spec.name, engine)  # (a child of the message's sender)
        log, task = timeline.timeline_of(engine), current_task()
        timing = timeline.TurnBuilder(self.spec.name, task.task_id if task is not None else None) \
            if log is not None else None
        await leases.acquire(self)
        try:
            with tracing.ending(span):
                async for ev in self._turn(messages, span.context, timing):
                    yield ev
                span.add(ev)  # the TurnResult
                await persist.save(engine, self.spec.name, self._conversation(), next(copy.copy(self._call_ids)))
        finally:
            leases.release(self)
            if log is not None and timing is not None:
                log.add(timing)

    async def _turn(self, messages: list[dict], trace: Any = None,
                    timing: timeline.TurnBuilder | None = None) -> AsyncIterator[Any]:
        """`trace`: the OpenTelemetry context of the turn's span (None: tracing is off);
        `timing`: where the rounds' and tools' times go (conversation/timeline.py)."""
        conversation = self._conversation()
        await conversation.add(messages)
        turn: list[dict] = []
        results: list[ToolResult] = []
        usage, text, failed = [], "", FailedCalls()
        for rnd in range(self.spec.max_tool_rounds + 1):
            yield RoundStarted(rnd, len(self.tokens))
            failed.start_round()
            base = next(self._call_ids)

            def call_id(index: int, base: int = base) -> str:
                return make_call_id(scoped(self.spec.name), base + index)
            end: RoundEnd | None = None
            done: dict[int, ToolResult | None] = {}  # call index -> its result (None: running)
            started = ended = timeline.now()
            async with _call_group() as tg:  # pure calls start mid-round
                async for ev in conversation.round(
                        self.spec.settings, tool_choice=self._choice(rnd), parallel_tool_calls=self.spec.parallel_tool_calls,
                        constrained=self.spec.constrained, call_id=call_id, content=clean_text, limits=self.spec.call_limits,
                        trace_context=trace):
                    if isinstance(ev, RoundEnd):
                        end, ended = ev, timeline.now()
                        self._start_calls(tg, [c for c in ev.calls if c.index not in done], call_id, done, trace,
                                          failed)
                        continue
                    if isinstance(ev, CallComplete) and self._is_pure(ev.name):
                        self._start_calls(tg, [ev], call_id, done, trace, failed)
                    yield ev
            if end is None:  # (a round's stream ends with its RoundEnd)
                raise ActorError(f"agent {self.spec.name!r}: a round ended without its RoundEnd")
            if timing is not None:
                timing.round(started, ended, end.usage)
                if end.calls:
                    timing.tools(ended, timeline.now())
            self._skip_ids(end)
            if end.usage is not None:
                usage.append(end.usage)
            text = end.message["content"]
            turn.append(end.message)
            if not end.calls and not end.invalid:
                yield TurnResult(text, turn, results, usage, rnd + 1)
                return
            round_results = self._gather(end, done, call_id)
            repeated = failed.end_round([(i, r) for i in sorted(done) if (r := done[i]) is not None])
            for r in round_results:
                yield ToolResultEvent(r)
            results += round_results
            tool_msgs = [{"role": "tool", "tool_call_id": r.call_id, "name": r.name, "content": r.content}
                         for r in round_results]
            turn += tool_msgs
            await conversation.add(tool_msgs)  # big results: cut, and encoded off the event loop
            stopper = next((r.name for r in round_results if r.name in self.spec.stop_at_tools and not r.is_error), None)
            if stopper is not None or repeated is not None:
                yield TurnResult(text, turn, results, usage, rnd + 1, stopped_by_tool=stopper,
                                 stopped_by_repeated_failure=None if stopper is not None else repeated)
                return
        yield TurnResult(text, turn, results, usage, self.spec.max_tool_rounds + 1, stopped_by_round_limit=True)

    def _choice(self, rnd: int) -> Any:
        if not self.tools or rnd >= self.spec.max_tool_rounds:
            return "none"
        return self.spec.tool_choice if rnd == 0 else "auto"

    def _is_pure(self, name: str) -> bool:
        t = self.tools.get(name)
        return t is not None and t.pure

    def mark(self) -> tuple[int, Any]:
        """Where the agent stands between turns (messages held, call-id counter), for `rewind`."""
        return len(self._conversation().messages), copy.copy(self._call_ids)

    def rewind(self, mark: tuple[int, Any]) -> None:
        """Forget a turn that failed after `mark` (its replica died, say): the messages it added
        and the call ids it used, so asking again continues as if it had never run."""
        count, ids = mark
        self._conversation().rewind(count)
        self._call_ids = copy.copy(ids)

    def _skip_ids(self, end: RoundEnd) -> None:
        """Call ids are base + parser index: keep the counter past this round's verdicts."""
        for _ in range(len(end.calls) + len(end.invalid) - 1):
            next(self._call_ids)

    def _start_calls(self, tg, calls, call_id: Callable[[int], str], done: dict, trace: Any,
                     failed: FailedCalls) -> None:
        """Start `calls` in `tg`; each call's span is a child of `trace` (the turn's). A call
        identical to one that failed earlier in the turn is not run (`failed`)."""
        ctx = ToolContext(agent=self.spec.name, deps=self.spec.deps)
        for c in calls:
            t = self.tools.get(c.name)
            if t is None:
                done[c.index] = unknown_tool_result(c.name, call_id(c.index), list(self.tools))
                continue
            repeat = failed.check(c.index, c.name, c.arguments, call_id(c.index))
            if repeat is not None:
                done[c.index] = repeat
                continue
            done[c.index] = None  # started

            async def run(c=c, t=t) -> None:
                with tracing.attached(trace):
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
