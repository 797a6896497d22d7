"""The Responses API's routes: `POST /v1/responses` (plain or streamed), `GET` and `DELETE
/v1/responses/{id}` (the caller's stored responses only). See run.py and render.py."""

from __future__ import annotations

from functools import partial

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..handling import Exchange, serve, tenant_salt
from ..round_runner import Body, respond
from ..round_runner import run as run_call
from .models import parse_request
from .render import Events
from .run import finish, prepare


def register(app: FastAPI, state) -> None:
    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await serve(request, state, "responses", create)

    @app.get("/v1/responses/{rid}")
    async def get(request: Request, rid: str):
        async def handler(ex: Exchange) -> Response:
            return JSONResponse(ex.state.responses.get(ex.caller, rid).body)
        return await serve(request, state, "responses", handler)

    @app.delete("/v1/responses/{rid}")
    async def delete(request: Request, rid: str):
        async def handler(ex: Exchange) -> Response:
            gone = await anyio.to_thread.run_sync(ex.state.responses.delete, ex.caller, rid)
            if gone is not None:  # (no stored response continues its session: its KV goes too)
                for router in ex.state.backends.routers:
                    await router.release(gone)
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        return await serve(request, state, "responses", handler)


async def create(ex: Exchange) -> Response:
    """parse -> prepare (the stored chain, its session) -> run -> render (stored when asked)."""
    req = parse_request(ex.body)
    run = prepare(req, ex.state, ex.caller, tenant_salt(ex.caller, req.cache_salt))
    renderer = Events(run, ex.state) if req.stream else Body(partial(finish, run, ex.state))
    return await respond(ex, run_call(run.call, ex.state), renderer, stream=req.stream, named=True)
