"""Anthropic's Messages API: `POST /v1/messages` (plain or streamed) and `POST
/v1/messages/count_tokens`, with Anthropic-shaped errors and `x-api-key` auth (anthropic_api.py).

Sessions are keyed as the chat route keys them: the `X-Session-Id` header, else
`metadata.user_id`, under the API key's tenant. Streaming sends `message_start`, per content
block `content_block_start` / `_delta` (`text_delta`, or `input_json_delta` fragments of a tool
call's input as the validator passes them) / `_stop`, then `message_delta` (stop reason and the
final usage) and `message_stop`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrt.conversation.conversation import Conversation, RoundEnd
from agentrt.conversation.reply import call_id
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta

from . import models as api
from ..openai import chat
from ..handling import finished_round, observe, serve, session_key, tenant_salt
from ..sse import EventStream


def register(app: FastAPI, state) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        return await serve(request, state, "messages", _create, anthropic=True)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        return await serve(request, state, "messages", _count, anthropic=True)


async def _count(request: Request, state, body: bytes, caller: str, t0: float) -> Response:
    req = api.parse_count(body)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in req.tools or ()]
    conv = Conversation(state.engine, tools=tools or None)
    await conv.add(api.chat_messages(req))
    return JSONResponse({"input_tokens": len(conv.tokens)})


async def _create(request: Request, state, body: bytes, caller: str, t0: float) -> Response:
    req = api.parse_messages(body)
    key = session_key(caller, request.headers.get("x-session-id") or req.user, None)
    call = chat.prepare(api.chat_request(req), key, state.config.model_name, tenant_salt(caller, None))
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    if req.stream:
        return await EventStream.start(_events(req, call, mid, state, caller, t0), named=True)

    end = await finished_round(request, state, call, caller, t0)
    if end is None:
        return Response(status_code=499)
    return JSONResponse(_message(req, call, mid, state, end))


def _message(req: api.MessagesRequest, call, mid: str, state, end: RoundEnd) -> dict:
    reason, seq = api.stop_reason(end, req.stop_sequences, state.engine.tokenizer.decode(end.generated))
    return {"id": mid, "type": "message", "role": "assistant", "model": call.model, "content": api.content(end),
            "stop_reason": reason, "stop_sequence": seq, "usage": api.usage(end)}


async def _events(req: api.MessagesRequest, call, mid: str, state, caller: str, t0: float) -> AsyncIterator[dict]:
    async with state.slot(caller):
        blocks: dict = {}  # ("text", n) or ("call", parser index) -> content block index
        open_text, first_at, started = None, None, False
        async for ev in chat.run(call, state):
            if not started:  # the request is accepted once the round runs
                started = True
                yield {"type": "message_start", "message": {
                    "id": mid, "type": "message", "role": "assistant", "model": call.model, "content": [],
                    "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}
            if isinstance(ev, TextDelta) and ev.text:
                first_at = first_at or time.perf_counter()
                if open_text is None:
                    open_text = blocks[("text", len(blocks))] = len(blocks)
                    yield {"type": "content_block_start", "index": open_text, "content_block": {"type": "text", "text": ""}}
                yield {"type": "content_block_delta", "index": open_text, "delta": {"type": "text_delta", "text": ev.text}}
            elif isinstance(ev, CallStarted):
                first_at = first_at or time.perf_counter()
                if open_text is not None:
                    yield {"type": "content_block_stop", "index": open_text}
                    open_text = None
                i = blocks[("call", ev.index)] = len(blocks)
                yield {"type": "content_block_start", "index": i, "content_block": {
                    "type": "tool_use", "id": call_id(call.call_prefix, ev.index), "name": ev.name, "input": {}}}
            elif isinstance(ev, ArgumentsDelta) and ("call", ev.index) in blocks:
                yield {"type": "content_block_delta", "index": blocks[("call", ev.index)],
                       "delta": {"type": "input_json_delta", "partial_json": ev.text}}
            elif isinstance(ev, CallInvalid):
                blocks.pop(("call", ev.index), None)
            elif isinstance(ev, RoundEnd):
                observe(state, ev.usage, t0, first_at)
                for k, i in sorted(blocks.items(), key=lambda kv: kv[1]):
                    if k[0] == "call" or i == open_text:
                        yield {"type": "content_block_stop", "index": i}
                msg = _message(req, call, mid, state, ev)
                yield {"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"],
                                                          "stop_sequence": msg["stop_sequence"]}, "usage": msg["usage"]}
                yield {"type": "message_stop"}
