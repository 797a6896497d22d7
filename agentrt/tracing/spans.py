"""The OpenTelemetry side of agentrt.tracing: imported by `enable()` only (needs the `otel` extra).

Spans are started with an explicit parent context (`tracer.start_span(..., context=parent)`) and
never attached across a `yield`: an agent turn and a round are async generators, consumed by
another task's frames, so a context attached inside one would leak into its consumer. A block
that runs in one task (a tool call, an actor's message, an HTTP request) attaches its context for
its callees (`attached`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from agentrt.tracing import attributes as A
from agentrt.workflow import current_task

try:
    from importlib.metadata import version as _dist_version

    _VERSION = _dist_version("agentrt")
except Exception:  # noqa: BLE001 - a source checkout without metadata
    _VERSION = "0"

SCOPE = "agentrt"  # the instrumentation scope's name


class LiveSpan:
    """One started span and the context its children take. `add(result)` records the result's
    attributes (through `describe`), `fail(error)` the error; `end()` ends it (once)."""

    __slots__ = ("span", "context", "_describe")

    def __init__(self, span: Any, describe: Callable[[Any], dict]) -> None:
        self.span, self._describe = span, describe
        self.context = trace.set_span_in_context(span)

    def add(self, result: Any) -> None:
        self.span.set_attributes(self._describe(result))

    def fail(self, error: BaseException) -> None:
        self.span.record_exception(error)
        self.span.set_attribute(A.ERROR_TYPE, type(error).__qualname__)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    def rename(self, name: str) -> None:
        self.span.update_name(name)

    def end(self) -> None:
        self.span.end()


class Spans:
    """Makes agentrt's spans from a tracer of `provider` (None: the global TracerProvider)."""

    def __init__(self, provider: Any = None) -> None:
        # (with no provider yet, a ProxyTracer: it follows the global provider once one is set)
        self.tracer = trace.get_tracer(SCOPE, _VERSION, tracer_provider=provider)

    @staticmethod
    def capture() -> Any:
        return otel_context.get_current()

    @staticmethod
    @contextlib.contextmanager
    def attached(context: Any) -> Iterator[None]:
        token = otel_context.attach(context)
        try:
            yield
        finally:
            otel_context.detach(token)

    def _start(self, name: str, kind: SpanKind, parent: Any, attributes: dict, describe) -> LiveSpan:
        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        return LiveSpan(span, describe)

    def agent_turn(self, agent: str, engine: Any, parent: Any) -> LiveSpan:
        attrs = {A.OPERATION: "invoke_agent", A.PROVIDER: A.PROVIDER_NAME, A.AGENT_NAME: agent,
                 A.REQUEST_MODEL: A.model_name(engine), **_task()}
        return self._start(f"invoke_agent {agent}", SpanKind.INTERNAL, parent, attrs, A.turn_attributes)

    def chat(self, engine: Any, params: Any, parent: Any) -> LiveSpan:
        model = A.model_name(engine)
        attrs = {A.OPERATION: "chat", A.PROVIDER: A.PROVIDER_NAME, A.REQUEST_MODEL: model,
                 **A.request_attributes(params), **_task()}
        policy = engine.config.scheduling_policy
        if policy is not None:
            attrs[A.POLICY] = policy
        return self._start(f"chat {model}", SpanKind.CLIENT, parent, attrs, A.round_attributes)

    def tool_call(self, tool: str, call_id: str, agent: str | None) -> LiveSpan:
        attrs = {A.OPERATION: "execute_tool", A.TOOL_NAME: tool, A.TOOL_CALL_ID: call_id, A.TOOL_TYPE: "function"}
        if agent:
            attrs[A.TOOL_AGENT] = agent
        return self._start(f"execute_tool {tool}", SpanKind.INTERNAL, None, attrs, A.tool_attributes)

    def http_request(self, method: str, path: str, headers: dict[str, str]) -> LiveSpan:
        """A SERVER span, child of the context the request's headers carry (W3C `traceparent` with
        OpenTelemetry's default propagator)."""
        attrs = {A.HTTP_METHOD: method, A.URL_PATH: path}
        return self._start(f"{method} {path}", SpanKind.SERVER, propagate.extract(headers), attrs, A.http_attributes)

    @staticmethod
    def add_ids(event: dict) -> dict:
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            event.setdefault("trace_id", format(ctx.trace_id, "032x"))
            event.setdefault("span_id", format(ctx.span_id, "016x"))
        return event

    @staticmethod
    def headers(context: Any) -> dict[str, str]:
        """The headers that carry `context` on (`traceparent`, maybe `tracestate`)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=context)
        return carrier


def _task() -> dict[str, Any]:
    """The agentrt task (workflow.py) the work belongs to, when there is one."""
    task = current_task()
    if task is None:
        return {}
    return {A.TASK_ID: task.task_id} | ({A.WORKFLOW: task.workflow} if task.workflow else {})
