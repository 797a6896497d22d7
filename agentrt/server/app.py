"""The ASGI app of `agentrt serve`: FastAPI routes over one Engine entered in the app's lifespan.

Every request: authenticate (bearer API key, when keys are configured), read the body under the
size limit, validate (protocol.py), take a slot of the key's concurrency limit (429 beyond it),
then run on the engine. The request runs in the handler's own task beside a watcher of the
connection: a client that disconnects cancels it, and cancellation frees what the request holds
(its engine request, its session lock) the way an in-process caller's does. Errors are
OpenAI-shaped bodies: 400 for bad input, 401, 404, 413, 429, 503 when the engine is closed, and
500 with no stack trace for a bug (logged).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrt.errors import ConfigError
from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.router import SessionPolicy, SessionRouter

from .anthropic import routes as messages_routes
from .openai import chat
from .openai.completions import TextRun
from .responses import routes as responses_routes
from .config import ServerConfig
from .metrics import Metrics
from .backends import Backends
from .handling import as_api_error, error_response, finished_round, observe, request_id, serve, session_key, tenant_salt
from .protocol import ApiError, ChatRequest, CompletionRequest, parse
from .responses.run import ResponseStore
from .sse import EventStream, until_disconnect
from .trace_headers import TraceHeaders

log = logging.getLogger("agentrt.server")


class ServerState:
    """What the routes share: the engines and their session routers (`backends`, set in the
    lifespan), limits, the stored responses."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.backends: Backends | None = None
        self.metrics = Metrics(self)
        self.active: dict[str, int] = {}  # API key id -> requests in flight
        self.responses = ResponseStore(config.max_stored_responses, config.response_ttl_s)

    @property
    def engine(self) -> Any:
        """A live engine (tokenizer, limits; the one engine without replicas)."""
        return None if self.backends is None else self.backends.engine

    @property
    def router(self) -> SessionRouter | None:
        """The first engine's session router (the only one without replicas)."""
        return None if self.backends is None else self.backends.routers[0]

    def caller(self, request: Request) -> str:
        """The caller's key id ("anon" without keys), or ApiError 401."""
        if not self.config.api_keys:
            return "anon"
        auth = request.headers.get("authorization", "")
        # Bearer (OpenAI's clients), or x-api-key (Anthropic's)
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else request.headers.get("x-api-key", "").strip()
        for k in self.config.api_keys:
            if token and hmac.compare_digest(token.encode(), k.encode()):
                return hashlib.sha256(k.encode()).hexdigest()[:12]
        raise ApiError("invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`)", 401,
                       type="authentication_error", code="invalid_api_key")

    @asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[None]:
        if self.active.get(key, 0) >= self.config.max_concurrency_per_key:
            raise ApiError(f"too many concurrent requests for this API key (limit "
                           f"{self.config.max_concurrency_per_key}); retry later", 429, type="rate_limit_error",
                           code="rate_limit_exceeded")
        self.active[key] = self.active.get(key, 0) + 1
        try:
            yield
        finally:
            self.active[key] -= 1


def build_app(model, config: ServerConfig | None = None, engine_config=None) -> FastAPI:
    """The app serving `model`: a LoadedModel on one in-process engine (or an Engine not yet
    started), or, with
    `config.replicas` > 1, a Ray `ModelSpec` on that many engine replicas. The engines start and
    stop with the app."""
    config = config or ServerConfig()
    if not isinstance(config, ServerConfig):
        raise ConfigError(f"config must be a ServerConfig, got {type(config).__name__}")
    state = ServerState(config)
    policy = SessionPolicy(config.max_sessions, config.session_ttl_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with _engines(model, config, engine_config) as engines:
            state.backends = Backends(engines, policy)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_sweep_idle, state)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True):
                        await state.backends.release_all()

    app = FastAPI(title="agentrt", lifespan=lifespan)
    app.add_middleware(TraceHeaders)  # (W3C traceparent in and out while agentrt.tracing is on)
    app.state.agentrt = state
    _handlers(app, state)
    _routes(app, state)
    responses_routes.register(app, state)
    messages_routes.register(app, state)
    if config.dashboard:
        _dashboard(app, state)
    return app


def _dashboard(app: FastAPI, state: ServerState) -> None:
    """The live dashboard at /dashboard/ (its engine: the one the lifespan starts)."""
    from fastapi.responses import RedirectResponse

    from agentrt.dashboard.app import Dashboard, build_app as dashboard_app

    app.mount("/dashboard/", dashboard_app(Dashboard(lambda: state.engine)))

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard_root():
        return RedirectResponse("/dashboard/")


@asynccontextmanager
async def _engines(model, config: ServerConfig, engine_config) -> AsyncIterator[list]:
    """One Engine on `model` (or `model` itself: an Engine built by the caller, with its own
    executor or policies), or `config.replicas` Ray replicas of a ModelSpec."""
    if config.replicas == 1:
        from agentrt.engine.engine import Engine

        async with (model if isinstance(model, Engine) else Engine(model, engine_config)) as engine:
            yield [engine]
        return
    from agentrt.integrations.ray import ClusterRuntime, ModelSpec

    if not isinstance(model, ModelSpec):
        raise ConfigError("serving on replicas takes a ModelSpec (each replica loads the model itself)")
    async with ClusterRuntime(model, replicas=config.replicas, engine_config=engine_config,
                              threads_per_replica=config.threads_per_replica) as cluster:
        yield cluster.replicas


async def _sweep_idle(state: ServerState) -> None:
    """Close sessions idle past their TTL even when no request comes to trigger it."""
    while True:
        await anyio.sleep(min(30.0, state.config.session_ttl_s / 4))
        await state.backends.release_idle()


def _handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(ApiError(f"{request.method} {request.url.path}: {exc.detail}", exc.status_code, type=kind))

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception):
        rid = request_id(request)
        log.exception("request %s %s %s failed", rid, request.method, request.url.path)
        response = error_response(as_api_error(exc, rid))
        response.headers["x-request-id"] = rid
        return response


def _routes(app: FastAPI, state: ServerState) -> None:
    cfg = state.config

    @app.get("/health")
    async def health():
        ok = state.backends is not None and bool(state.backends.live())
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models(request: Request):
        state.caller(request)
        card = {"id": cfg.model_name, "object": "model", "created": 0, "owned_by": "agentrt",
                "max_model_len": state.engine.max_context_tokens}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, state, "chat", _chat)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, state, "completions", _text)


async def _chat(request: Request, state: ServerState, body: bytes, caller: str, t0: float) -> Response:
    req = parse(ChatRequest, body)
    call = chat.prepare(req, session_key(caller, req.prompt_cache_key or request.headers.get("x-session-id") or req.user,
                                    req.cache_salt), state.config.model_name,
                        tenant_salt(caller, req.cache_salt))
    if req.stream:
        return await EventStream.start(_chat_chunks(call, state, caller, t0))

    end = await finished_round(request, state, call, caller, t0)
    if end is None:
        return Response(status_code=499)  # the client went away; nothing was kept for it
    return JSONResponse(chat.response(call, end))


async def _chat_chunks(call, state: ServerState, caller: str, t0: float) -> AsyncIterator[dict]:
    """The chunk dicts of one streamed chat request (an ApiError before the first one)."""
    async with state.slot(caller):
        chunks, first_at, started = chat.Chunks(call), None, False
        async for ev in chat.run(call, state):
            if not started:  # the request is accepted once the round runs
                started = True
                yield chunks.first()
            if isinstance(ev, RoundEnd):
                observe(state, ev.usage, t0, first_at)
                for c in chunks.last(ev):
                    yield c
            elif (c := chunks.event(ev)) is not None:
                first_at = first_at or time.perf_counter()
                yield c


async def _text(request: Request, state: ServerState, body: bytes, caller: str, t0: float) -> Response:
    req = parse(CompletionRequest, body)
    run = TextRun(req, state, state.config.model_name, tenant_salt(caller, req.cache_salt))
    if req.stream:
        return await EventStream.start(_text_chunks(run, state, caller, t0))

    async def work():
        async with state.slot(caller):
            async for _ in run.pieces():
                pass
            return True

    if not await until_disconnect(request, work):
        return Response(status_code=499)
    observe(state, run.usage, t0, first=None)
    return JSONResponse(run.body(run.text, run.finish, final=True))


async def _text_chunks(run: TextRun, state: ServerState, caller: str, t0: float) -> AsyncIterator[dict]:
    async with state.slot(caller):
        first_at = None
        yield run.body("", None, final=False)
        async for piece in run.pieces():
            first_at = first_at or time.perf_counter()
            yield run.body(piece, None, final=False)
        observe(state, run.usage, t0, first_at)
        yield run.body("", run.finish, final=True)
        if run.req.include_usage:
            yield run.usage_chunk()
