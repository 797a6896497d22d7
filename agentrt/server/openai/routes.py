"""OpenAI's routes: `/v1/models`, `/v1/chat/completions` (chat.py), `/v1/completions`
(completions.py)."""

from __future__ import annotations

from fastapi import FastAPI, Request

from ..handling import serve
from . import chat, completions


def register(app: FastAPI, state) -> None:
    @app.get("/v1/models")
    async def models(request: Request):
        state.caller(request)
        config = state.config
        card = {"id": config.model_name, "object": "model", "created": 0, "owned_by": "agentrt",
                "max_model_len": state.engine.max_context_tokens}
        adapters = [{**card, "id": name, "parent": config.model_name, "root": path} for name, path in config.adapters]
        return {"object": "list", "data": [card, *adapters]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, state, "chat", chat.create)

    @app.post("/v1/completions")
    async def text_completions(request: Request):
        return await serve(request, state, "completions", completions.create)
