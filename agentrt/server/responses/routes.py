"""The Responses API's routes: `POST /v1/responses` (plain or streamed), `GET` and `DELETE
/v1/responses/{id}` (the caller's stored responses only). See responses.py."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from . import run as responses
from ..handling import finished_round, observe, serve, tenant_salt
from .models import parse_request
from ..sse import EventStream


def register(app: FastAPI, state) -> None:
    @app.post("/v1/responses")
    async def create(request: Request):
        return await serve(request, state, "responses", _create)

    @app.get("/v1/responses/{rid}")
    async def get(request: Request, rid: str):
        async def handler(request, state, body, caller, t0):
            return JSONResponse(state.responses.get(caller, rid).body)
        return await serve(request, state, "responses", handler)

    @app.delete("/v1/responses/{rid}")
    async def delete(request: Request, rid: str):
        async def handler(request, state, body, caller, t0):
            state.responses.delete(caller, rid)
            return JSONResponse({"id": rid, "object": "response", "deleted": True})
        return await serve(request, state, "responses", handler)


async def _create(request: Request, state, body: bytes, caller: str, t0: float) -> Response:
    req = parse_request(body)
    run = responses.prepare(req, state, caller, tenant_salt(caller, req.cache_salt))
    if req.stream:
        return await EventStream.start(_events(run, state, caller, t0), named=True)

    end = await finished_round(request, state, run.call, caller, t0)
    if end is None:
        return Response(status_code=499)
    return JSONResponse(responses.finish(run, state, end))


async def _events(run: responses.ResponseRun, state, caller: str, t0: float) -> AsyncIterator[dict]:
    async with state.slot(caller):
        first_at = None
        async for ev in responses.stream(run, state):
            if ev["type"] == "response.output_text.delta" or ev["type"].endswith("output_item.added"):
                first_at = first_at or time.perf_counter()
            if ev["type"] in ("response.completed", "response.incomplete"):
                observe(state, run.end.usage, t0, first_at)
            yield ev
