"""OpenAI's `/v1/chat/completions`: one request -> one `Conversation.round()` on a routed KV session
(round_runner.py), rendered as a `chat.completion` or as `chat.completion.chunk`s.

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

from functools import partial
from typing import Any

from fastapi.responses import Response

from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id, finish_reason
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta

from ..handling import Exchange, session_key, tenant_salt
from ..protocol import ChatRequest, parse
from ..round_runner import Body, ChatCall, prepare, respond, run


async def create(ex: Exchange) -> Response:
    """parse -> prepare -> run -> render: the body as a ChatRequest, its round on the session of
    its `prompt_cache_key` (else X-Session-Id, else `user`) under the caller's tenant."""
    req = parse(ChatRequest, ex.body)
    key = req.prompt_cache_key or ex.request.headers.get("x-session-id") or req.user
    call = prepare(req, session_key(ex.caller, key, req.cache_salt), ex.state.config.served_model(req.model),
                   tenant_salt(ex.caller, req.cache_salt))
    renderer = Chunks(call) if req.stream else Body(partial(response, call))
    return await respond(ex, run(call, ex.state), renderer, stream=req.stream)


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
    """The streaming Renderer: parser events -> OpenAI `chat.completion.chunk` dicts."""

    def __init__(self, call: ChatCall) -> None:
        self.call = call
        self.invalid: set[int] = set()

    def chunk(self, delta: dict, finish: str | None = None, **extra: Any) -> dict:
        c = self.call
        return {"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": c.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}]}

    def first(self) -> list[dict]:
        return [self.chunk({"role": "assistant", "content": ""})]

    def event(self, ev: Any) -> list[dict]:
        if isinstance(ev, TextDelta):
            return [self.chunk({"content": ev.text})] if ev.text else []
        if isinstance(ev, CallStarted):
            return [self.chunk({"tool_calls": [{"index": ev.index, "id": call_id(self.call.call_prefix, ev.index),
                                                "type": "function", "function": {"name": ev.name, "arguments": ""}}]})]
        if isinstance(ev, ArgumentsDelta) and ev.index not in self.invalid:
            return [self.chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})]
        if isinstance(ev, CallInvalid):
            self.invalid.add(ev.index)
        return []

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
