"""Anthropic's Messages API: `POST /v1/messages` (plain or streamed) and `POST
/v1/messages/count_tokens`, with Anthropic-shaped errors and `x-api-key` auth (models.py).

Sessions are keyed as the chat route keys them: the `X-Session-Id` header, else
`metadata.user_id`, under the API key's tenant. The stream's events: render.py.
"""

from __future__ import annotations

import uuid
from functools import partial

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from agentrt.conversation.conversation import Conversation

from ..handling import Exchange, serve, session_key, tenant_salt
from ..round_runner import Body, prepare, respond, run
from . import models as api
from .render import Events, message


def register(app: FastAPI, state) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request):
        return await serve(request, state, "messages", create, anthropic=True)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        return await serve(request, state, "messages", count, anthropic=True)


async def count(ex: Exchange) -> Response:
    req = api.parse_count(ex.body)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in req.tools or ()]
    conv = Conversation(ex.state.engine, tools=tools or None)
    await conv.add(api.chat_messages(req))
    return JSONResponse({"input_tokens": len(conv.tokens)})


async def create(ex: Exchange) -> Response:
    """parse -> prepare -> run -> render: the body as a ChatRequest, its round on its session."""
    req = api.parse_messages(ex.body)
    key = session_key(ex.caller, ex.request.headers.get("x-session-id") or req.user, None)
    call = prepare(api.chat_request(req), key, ex.state.config.served_model(req.model), tenant_salt(ex.caller, None))
    mid = f"msg_{uuid.uuid4().hex[:24]}"
    renderer = Events(req, call, mid, ex.state) if req.stream else Body(partial(message, req, call, mid, ex.state))
    return await respond(ex, run(call, ex.state), renderer, stream=req.stream, named=True)
