"""The one round runner of the server's create handlers: parse -> prepare -> run -> render.

Each wire protocol (`openai/`, `responses/`, `anthropic/`) parses a body into its own request
(`protocol.parse`, a 400 naming the field) and states it as a `ChatRequest`; `prepare` resolves
that as a `ChatCall`; `run` runs the call as one `Conversation.round()` on the routed KV session
of its key; `respond` drives a run under the caller's concurrency slot and renders it with the
protocol's `Renderer`: streamed as server-sent events, or as one JSON body (`Body`). A raw prompt
(`/v1/completions`) runs on the engine itself, through the same `respond`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response

from agentrt.conversation import timeline
from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id, call_prefix
from agentrt.conversation.router import routed_conversation
from agentrt.engine.context_length import context_overflow
from agentrt.errors import ContextLengthExceeded, ReplicaLost, SchemaUnsupported
from agentrt.sampling import SamplingParams

from .handling import Exchange, observe
from .protocol import ApiError, ChatRequest, json_schema_of, to_messages, tool_choice_of, tools_of
from .sse import EventStream, until_disconnect


@dataclass
class ChatCall:
    """A validated chat request, resolved against the server's limits."""

    req: ChatRequest
    messages: list[dict]
    tools: list[dict] | None
    tool_choice: Any
    json_schema: Any
    key: str | None
    model: str
    id: str
    created: int
    salt: str | None = None  # the tenant's cache salt (API key id, and the request's cache_salt)
    reasoning: bool = False  # stream a thinking model's <think> block as ReasoningDelta events
    call_prefix: str = "call"  # call ids: <prefix>_<index>, from the prompt (streamed = not streamed)


def prepare(req: ChatRequest, key: str | None, model: str, salt: str | None = None) -> ChatCall:
    tools = tools_of(req)
    return ChatCall(req, to_messages(req.messages), tools, tool_choice_of(req, tools), json_schema_of(req.response_format),
                    key, model, f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), salt)


async def run(call: ChatCall, state) -> AsyncGenerator[Any, None]:
    """The round's parser events, then its RoundEnd (ApiError before any event when the request
    cannot be served: over the limits, or no room in the context). On replicas, a replica lost
    before the first event is replaced by a live one (the history is in the call)."""
    backends = state.backends
    attempts = len(backends.engines)
    for attempt in range(attempts):
        i, sent = backends.pick(call.key), False
        try:
            async for ev in _round(call, state, backends.engines[i], backends.routers[i]):
                sent = True
                yield ev
            return
        except ReplicaLost:
            backends.lost(i)
            if sent or attempt == attempts - 1:
                raise


async def _round(call: ChatCall, state, engine, router) -> AsyncGenerator[Any, None]:
    req = call.req
    async with routed_conversation(router, call.key, call.messages, call.tools, tag=call.key,
                                   cache_salt=call.salt) as (conv, _):
        call.call_prefix = prefix = call_prefix(conv.tokens)
        params = _params(req, len(conv.tokens), engine.max_context_tokens, state.config.max_tokens_limit)
        rounds = conv.round(params, tool_choice=call.tool_choice, parallel_tool_calls=req.parallel_tool_calls,
                            json_schema=call.json_schema, stop=req.stop, call_id=partial(call_id, prefix),
                            tag=call.key, reasoning=call.reasoning, adapter=state.config.adapter_of(call.model))
        log = timeline.timeline_of(engine)  # (the dashboard's turn timeline: a request is a turn)
        turn = timeline.TurnBuilder(call.key or call.model) if log is not None else None
        try:
            async with aclosing(rounds) as events:
                async for ev in events:
                    if turn is not None and isinstance(ev, RoundEnd):
                        turn.round(turn.start, timeline.now(), ev.usage)
                        log.add(turn)
                    yield ev
        except ContextLengthExceeded as e:
            raise _too_long(e) from None
        except SchemaUnsupported as e:
            raise _schema_error(call, e) from None


def _params(req: ChatRequest, prompt: int, limit: int, cap: int) -> SamplingParams:
    """The round's sampling params: max_tokens as asked, else what fits (at most the server's cap)."""
    max_tokens = req.max_completion_tokens or req.max_tokens or min(cap, limit - prompt)
    if max_tokens > cap:
        raise ApiError(f"max_tokens {max_tokens} is over this server's limit "
                       f"({cap}; see `agentrt serve --max-tokens-limit`)", param="max_tokens")
    overflow = context_overflow(prompt, max_tokens, limit)
    if overflow is not None:  # refused, not trimmed: the client sent this history and max_tokens
        raise _too_long(overflow)
    return req.sampling(max_tokens)


def _schema_error(call: ChatCall, e: SchemaUnsupported) -> ApiError:
    """A schema the grammar backend cannot compile is the client's to fix: 400 at its field."""
    names = [t["function"]["name"] for t in call.tools or ()]
    if e.tool is not None and e.tool in names:
        param = f"tools.{names.index(e.tool)}.function.parameters"
    else:
        param = "response_format.json_schema.schema"
    return ApiError(str(e), param=param, code="unsupported_schema")


def _too_long(e: ContextLengthExceeded) -> ApiError:
    return ApiError(str(e), code="context_length_exceeded", param="messages")


# ---- render ---------------------------------------------------------------------------------

class Renderer(Protocol):
    """A wire protocol's rendering of one run, as the dicts it sends: each an SSE event when
    streamed, or (`Body`) the one JSON body."""

    def first(self) -> list[dict]:
        """Once the run yields its first event: the request is accepted (an error before it is a
        plain error response)."""

    def event(self, ev: Any) -> list[dict]:
        """For one event of the run ([]: nothing to send for it)."""

    def last(self, end: RoundEnd) -> list[dict]:
        """For the run's end (the run has let go of its session by then)."""


class Body:
    """The Renderer of a non-streaming request: nothing while the run goes, then its body."""

    def __init__(self, make: Callable[[RoundEnd], dict]) -> None:
        self.make = make

    def first(self) -> list[dict]:
        return []

    def event(self, ev: Any) -> list[dict]:
        return []

    def last(self, end: RoundEnd) -> list[dict]:
        return [self.make(end)]


async def respond(ex: Exchange, events: AsyncGenerator[Any, None], renderer: Renderer, *, stream: bool,
                  named: bool = False) -> Response:
    """The response to a prepared run (`events`: its events, its RoundEnd last): a stream of what
    `renderer` makes of them (`named`: SSE events with their type, see sse.EventStream), or the
    one body it makes -- 499 when the client went away before the end (nothing was kept for it)."""
    items = _rendered(ex, events, renderer)
    if stream:
        return await EventStream.start(items, named=named)
    out = await until_disconnect(ex.request, partial(_drain, items))
    return Response(status_code=499) if out is None else JSONResponse(out[-1])


async def _drain(items: AsyncGenerator[dict, None]) -> list[dict]:
    async with aclosing(items):
        return [item async for item in items]


async def _rendered(ex: Exchange, events: AsyncGenerator[Any, None], renderer: Renderer) -> AsyncGenerator[dict, None]:
    """What `renderer` makes of the run, under the caller's concurrency slot; the run counted in
    the metrics (time to first token: to the first event it renders)."""
    async with ex.state.slot(ex.caller):
        end, first_at, started = None, None, False
        async with aclosing(events):  # (a round's session lock goes with it)
            async for ev in events:
                if not started:  # the request is accepted once the run yields
                    started = True
                    for item in renderer.first():
                        yield item
                if isinstance(ev, RoundEnd):
                    end = ev
                    continue
                made = renderer.event(ev)
                if made and first_at is None:
                    first_at = time.perf_counter()
                for item in made:
                    yield item
        if end is None:  # (every run yields its RoundEnd last: round_runner.run, TextRun.events)
            raise RuntimeError("the run ended without its RoundEnd")
        observe(ex.state, end.usage, ex.t0, first_at)
        for item in renderer.last(end):
            yield item
