"""The ASGI app of `agentrt serve`: FastAPI routes over one Engine entered in the app's lifespan.

This module only assembles the app: the state the routes share (state.py), the lifespan that
starts and stops the engines, the trace middleware, the error handlers (handling.py), and the
routes -- the server's own (service_routes.py) and one set per wire protocol: `openai/`,
`responses/`, `anthropic/`.

Every request: authenticate (bearer API key, when keys are configured), read the body under the
size limit, validate (the protocol's request model), take a slot of the key's concurrency limit
(429 beyond it), then run on the engine (round_runner.py). The request runs in the handler's own
task beside a watcher of the connection: a client that disconnects cancels it, and cancellation
frees what the request holds (its engine request, its session lock) the way an in-process
caller's does. Errors are OpenAI-shaped bodies: 400 for bad input, 401, 404, 413, 429, 503 when
the engine is closed, and 500 with no stack trace for a bug (logged).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from fastapi import FastAPI

from agentrt.conversation.router import SessionPolicy
from agentrt.errors import ConfigError
from agentrt.state.backends import open_store

from . import service_routes
from .anthropic import routes as anthropic_routes
from .backends import Backends
from .config import ServerConfig
from .handling import install_error_handlers
from .openai import routes as openai_routes
from .responses import routes as responses_routes
from .state import ServerState
from .trace_headers import TraceHeaders

ROUTES = (service_routes, openai_routes, responses_routes, anthropic_routes)


def build_app(model, config: ServerConfig | None = None, engine_config=None) -> FastAPI:
    """The app serving `model`: a LoadedModel on one in-process engine (or an Engine not yet
    started), or, with
    `config.replicas` > 1, a Ray `ModelSpec` on that many engine replicas. The engines start and
    stop with the app."""
    config = config or ServerConfig()
    if not isinstance(config, ServerConfig):
        raise ConfigError(f"config must be a ServerConfig, got {type(config).__name__}")
    state = ServerState(config)
    app = FastAPI(title="agentrt", lifespan=_lifespan(state, model, engine_config))
    app.add_middleware(TraceHeaders)  # (W3C traceparent in and out while agentrt.tracing is on)
    app.state.agentrt = state
    install_error_handlers(app)
    for routes in ROUTES:
        routes.register(app, state)
    if config.dashboard:
        _dashboard(app, state)
    return app


def _lifespan(state: ServerState, model, engine_config):
    """The app's lifespan: the engines (and their session routers) up, idle sessions swept, all
    released at the end."""
    config = state.config
    policy = SessionPolicy(config.max_sessions, config.session_ttl_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async with _engines(model, config, engine_config) as engines:
            state.backends = backends = Backends(engines, policy)
            cfg = engine_config or engines[0].config  # (an Engine's or a replica's: both EngineLike)
            store = open_store(cfg.state_dir, cfg.state_url)
            state.responses.attach(store, cfg.state_dir)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_sweep_idle, backends, config.session_ttl_s)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
                    with anyio.CancelScope(shield=True):
                        await backends.release_all()
                    if store is not None:
                        store.close()

    return lifespan


def _dashboard(app: FastAPI, state: ServerState) -> None:
    """The live dashboard at /dashboard/ (its engine: the one the lifespan starts)."""
    from fastapi.responses import RedirectResponse

    from agentrt.dashboard.app import Dashboard
    from agentrt.dashboard.app import build_app as dashboard_app

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
            for name, path in config.adapters:  # (`agentrt serve --adapter name=path`)
                await engine.load_adapter(name, path)
            yield [engine]
        return
    from agentrt.integrations.ray import ClusterRuntime, ModelSpec

    if not isinstance(model, ModelSpec):
        raise ConfigError("serving on replicas takes a ModelSpec (each replica loads the model itself)")
    async with ClusterRuntime(model, replicas=config.replicas, engine_config=engine_config,
                              threads_per_replica=config.threads_per_replica) as cluster:
        for name, path in config.adapters:  # (on every replica: a conversation may move)
            await cluster.load_adapter(name, path)
        yield cluster.replicas


async def _sweep_idle(backends: Backends, ttl_s: float) -> None:
    """Close sessions idle past their TTL even when no request comes to trigger it."""
    while True:
        await anyio.sleep(min(30.0, ttl_s / 4))
        await backends.release_idle()
