"""`/v1/chat/completions`: one request -> one `Conversation.round()` on a routed KV session.

The conversation key is the request's `prompt_cache_key`, else the `X-Session-Id` header, else
`user`, namespaced by the API key that made the request; a request without one is transient (the
radix cache still shares its prefixes). The key's session keeps the ledger of the messages it
holds (`agentrt.conversation.router`), so a client that resends the whole history prefills only the
new messages, and `usage.prompt_tokens_details.cached_tokens` is the prompt tokens served from
KV already held.

Streaming follows OpenAI's chunk shapes: the role first, text as it decodes, each tool call as a
first delta with its id and name and then its argument fragments as the validator passes them
(under the tool grammar they always complete, unless `max_tokens` cuts the call: then the
finish reason is "length"), then the finish reason, then a usage chunk when
`stream_options.include_usage` is set. A call the validator rejects never reaches `tool_calls`
in a response; it is reported under `agentrt.invalid_tool_calls`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from functools import partial
from typing import Any

from agentrt.engine.context import context_overflow
from agentrt.errors import ContextLengthExceeded, ReplicaLost, SchemaUnsupported
from agentrt.sampling import SamplingParams
from agentrt.conversation import timeline
from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id, call_prefix, finish_reason
from agentrt.conversation.router import routed_conversation
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta

from ..protocol import ApiError, ChatRequest, json_schema_of, to_messages, tool_choice_of, tools_of


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


async def run(call: ChatCall, state) -> AsyncIterator[Any]:
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


async def _round(call: ChatCall, state, engine, router) -> AsyncIterator[Any]:
    req = call.req
    async with routed_conversation(router, call.key, call.messages, call.tools, tag=call.key,
                                   cache_salt=call.salt) as (conv, _):
        call.call_prefix = prefix = call_prefix(conv.tokens)
        limit = engine.max_context_tokens
        max_tokens = req.max_completion_tokens or req.max_tokens or min(state.config.max_tokens_limit,
                                                                         limit - len(conv.tokens))
        if max_tokens > state.config.max_tokens_limit:
            raise ApiError(f"max_tokens {max_tokens} is over this server's limit "
                           f"({state.config.max_tokens_limit}; see `agentrt serve --max-tokens-limit`)", param="max_tokens")
        overflow = context_overflow(len(conv.tokens), max_tokens, limit)
        if overflow is not None:  # refused, not trimmed: the client sent this history and max_tokens
            raise _too_long(overflow)
        params = SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                                ignore_eos=req.ignore_eos)
        rounds = conv.round(params, tool_choice=call.tool_choice, parallel_tool_calls=req.parallel_tool_calls,
                            json_schema=call.json_schema, stop=req.stop, call_id=partial(call_id, prefix),
                            tag=call.key, reasoning=call.reasoning)
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


def usage(end: RoundEnd) -> dict | None:
    u = end.usage
    if u is None:
        return None
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
            "agentrt": {"computed_prompt_tokens": u.computed_prompt_tokens}}


def _extras(call: ChatCall, end: RoundEnd) -> dict:
    out: dict[str, Any] = {}
    if end.invalid:
        out["invalid_tool_calls"] = [{"index": c.index, "name": c.name, "raw": c.raw, "reason": str(c.reason)}
                                     for c in end.invalid]
    if call.key is not None:
        out["session"] = call.key.split(":", 1)[-1]
    return out


def response(call: ChatCall, end: RoundEnd) -> dict:
    """The non-streaming response body of a finished round."""
    msg = end.message
    message: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or None}
    if msg.get("tool_calls"):
        message["tool_calls"] = msg["tool_calls"]
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish_reason(end), "logprobs": None}
    if call.req.return_token_ids:
        choice["token_ids"] = list(end.generated)
    body = {"id": call.id, "object": "chat.completion", "created": call.created, "model": call.model,
            "choices": [choice], "usage": usage(end), "system_fingerprint": None}
    if extras := _extras(call, end):
        body["agentrt"] = extras
    return body


class Chunks:
    """Parser events -> OpenAI `chat.completion.chunk` dicts."""

    def __init__(self, call: ChatCall) -> None:
        self.call = call
        self.invalid: set[int] = set()

    def chunk(self, delta: dict, finish: str | None = None, **extra: Any) -> dict:
        c = self.call
        return {"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}]}

    def first(self) -> dict:
        return self.chunk({"role": "assistant", "content": ""})

    def event(self, ev: Any) -> dict | None:
        if isinstance(ev, TextDelta):
            return self.chunk({"content": ev.text}) if ev.text else None
        if isinstance(ev, CallStarted):
            return self.chunk({"tool_calls": [{"index": ev.index, "id": call_id(self.call.call_prefix, ev.index), "type": "function",
                                               "function": {"name": ev.name, "arguments": ""}}]})
        if isinstance(ev, ArgumentsDelta) and ev.index not in self.invalid:
            return self.chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
        if isinstance(ev, CallInvalid):
            self.invalid.add(ev.index)
        return None

    def last(self, end: RoundEnd) -> list[dict]:
        extra = {"token_ids": list(end.generated)} if self.call.req.return_token_ids else {}
        out = [self.chunk({}, finish_reason(end), **extra)]
        if extras := _extras(self.call, end):
            out[0]["agentrt"] = extras
        if self.call.req.include_usage:
            c = self.call
            out.append({"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
                        "system_fingerprint": None, "choices": [], "usage": usage(end)})
        return out
