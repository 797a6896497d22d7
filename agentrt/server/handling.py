"""What every route of the server shares: the error body of any failure, the request id, the
body read under the size limit, tenants' salts and session keys, and `serve` -- authenticate,
read, run the route's handler on the `Exchange`, answer any failure as an OpenAI (or Anthropic)
error, count it."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrt.errors import (
    AgentrtError,
    ConfigError,
    ContextLengthExceeded,
    EngineClosed,
    PoolExhausted,
    ReplicaLost,
    SchemaUnsupported,
)

from .protocol import ApiError

log = logging.getLogger("agentrt.server")


@dataclass(frozen=True)
class Exchange:
    """One request as a route's handler gets it: the HTTP request, the server's state, the
    caller's key id ("anon" without keys), the body (read under the size limit), its arrival."""

    request: Request
    state: Any
    caller: str
    body: bytes
    t0: float


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def install_error_handlers(app: FastAPI) -> None:
    """Failures outside a route's handler (an unknown route, a bug in the app) as OpenAI error bodies."""
    # (starlette types every handler as taking Exception; this one only gets HTTPException)
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _any_error)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(ApiError(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code, type=kind))


async def _any_error(request: Request, exc: Exception) -> JSONResponse:
    rid = request_id(request)
    log.exception("request %s %s %s failed", rid, request.method, request.url.path)
    response = error_response(as_api_error(exc, rid))
    response.headers["x-request-id"] = rid
    return response


def as_api_error(exc: BaseException, rid: str | None = None) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthExceeded):
        return ApiError(str(exc), code="context_length_exceeded")
    if isinstance(exc, ConfigError):
        return ApiError(str(exc))
    if isinstance(exc, EngineClosed):
        return ApiError("the engine is not running; see the server log", 503, type="server_error")
    if isinstance(exc, PoolExhausted):
        return ApiError(f"the server is at capacity: {exc}", 503, type="server_error")
    if isinstance(exc, ReplicaLost):
        return ApiError(f"an engine replica died with this request in flight; send it again: {exc}", 503,
                        type="server_error")
    if isinstance(exc, SchemaUnsupported):
        return ApiError(str(exc), code="unsupported_schema")
    where = f" (request id {rid})" if rid else ""
    if isinstance(exc, AgentrtError):
        return ApiError(f"{type(exc).__name__}{where}: {exc}", 500, type="server_error")
    return ApiError(f"internal server error{where}; see the server log", 500, type="server_error")


async def read_body(request: Request, limit: int) -> bytes:
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise ApiError(f"the request body is over {limit} bytes", 413)
    chunks, total = [], 0
    async for part in request.stream():
        total += len(part)
        if total > limit:
            raise ApiError(f"the request body is over {limit} bytes", 413)
        chunks.append(part)
    return b"".join(chunks)


def tenant_salt(caller: str, cache_salt: str | None) -> str | None:
    """The radix/response-cache salt of a request: its API key's id (tenants never share cached
    prefixes) and its own `cache_salt` (finer isolation inside a key). None: no keys, no salt."""
    if caller == "anon" and cache_salt is None:
        return None
    return f"{caller}/{cache_salt or ''}"


def session_key(caller: str, key: str | None, cache_salt: str | None) -> str | None:
    """`<tenant>:<client's key>`; the tenant is the API key's id, with a hash of the request's
    cache_salt when it has one (a session lives under one salt)."""
    if cache_salt is not None:
        caller += "+" + hashlib.sha256(cache_salt.encode()).hexdigest()[:12]
    return f"{caller}:{key}" if key else None


async def serve(request: Request, state, endpoint: str, handler: Callable[[Exchange], Awaitable[Response]],
                anthropic: bool = False) -> Response:
    """Run a route's handler; any failure is an error body (OpenAI's, or Anthropic's shape)."""
    t0 = time.perf_counter()
    rid = request_id(request)
    try:
        caller = state.caller(request)
        body = await read_body(request, state.config.max_request_bytes)
        response = await handler(Exchange(request, state, caller, body, t0))
    except Exception as e:  # noqa: BLE001 - every failure becomes an OpenAI error body
        err = as_api_error(e, rid)
        if err.status >= 500:
            log.exception("%s request %s failed", endpoint, rid)
        response = JSONResponse(err.anthropic_body(), status_code=err.status) if anthropic else error_response(err)
    response.headers["x-request-id"] = rid
    state.metrics.requests.labels(endpoint, str(response.status_code)).inc()
    return response


def request_id(request: Request) -> str:
    """The client's X-Request-Id when it is a short token, else a new one: it names the request
    in the log and in a 500's message, so a report can be matched to its traceback."""
    given = request.headers.get("x-request-id", "")
    if 0 < len(given) <= 64 and all(c.isalnum() or c in "-_.:" for c in given):
        return given
    return f"req-{uuid.uuid4().hex[:20]}"


def observe(state, usage, t0: float, first: float | None) -> None:
    now = time.perf_counter()
    state.metrics.usage(usage)
    state.metrics.latency.observe(now - t0)
    state.metrics.ttft.observe((first or now) - t0)

