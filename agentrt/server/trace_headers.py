"""W3C trace context over HTTP (agentrt.tracing): an ASGI middleware.

With tracing on, each HTTP request is a SERVER span `{method} {route}`, a child of the client's
`traceparent` header when it sends one, and current while the route runs (the request's `chat`
span is its child); the response carries the span's own `traceparent`, so a client can find the
server's part of its trace. With tracing off the middleware only passes the request on.
"""

from __future__ import annotations

from typing import Any

from agentrt import tracing


class TraceHeaders:
    """Pure ASGI (no extra task): the span's context is attached in the task that runs the route."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not tracing.is_enabled():
            await self.app(scope, receive, send)
            return
        span = tracing.http_request(scope["method"], scope["path"], _headers(scope))
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in tracing.headers(span.context).items()]
        status = [500]  # (a route that raises before it starts a response)

        async def send_traced(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), *out]}
            await send(message)

        with tracing.ending(span):
            try:
                with tracing.attached(span.context):
                    await self.app(scope, receive, send_traced)
            finally:
                # starlette's route object: a third-party type, set only once a route matched
                route = getattr(scope.get("route"), "path", None)  # (set by the router once matched)
                if route:
                    span.rename(f"{scope['method']} {route}")
                span.add((status[0], route))


def _headers(scope: dict) -> dict[str, str]:
    """The request's headers, names lower-case (the propagator's carrier)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
