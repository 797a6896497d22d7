"""The server's own routes, beside the wire protocols': `/health` and `/metrics`."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse


def register(app: FastAPI, state) -> None:
    @app.get("/health")
    async def health():
        ok = state.backends is not None and bool(state.backends.live())
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")
