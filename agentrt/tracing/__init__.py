"""OpenTelemetry traces of agent turns, model rounds and tool calls (the `otel` extra).

    import agentrt
    agentrt.tracing.enable()            # spans go to the global TracerProvider
    agentrt.tracing.enable(provider)    # ... or to this one

Spans follow the OpenTelemetry GenAI semantic conventions (attributes.py): `invoke_agent {agent}`
per agent turn, `chat {model}` per generation round (`Conversation.round`: agents, ChatAgentrt,
the server), `execute_tool {tool}` per tool call, plus agentrt's own numbers (`agentrt.*`:
prefill computed vs reused, queue wait, KV promotion, speculation, the scheduling policy's
choice). The context follows the work: a message to an actor carries its sender's context, so
the asked agent's turn is a child of the asking tool's span; the server reads and writes W3C
`traceparent` headers (http.py).

Off (the default) costs nothing: this module does not import OpenTelemetry, and every hook
returns a shared no-op (`NO_SPAN`) or None without building a span. `enable()` imports spans.py,
which needs the `otel` extra.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from agentrt.errors import ConfigError

if TYPE_CHECKING:  # (spans.py imports OpenTelemetry: only enable() loads it)
    from agentrt.tracing.spans import Spans

__all__ = ["add_trace_ids", "disable", "enable", "ending", "is_enabled"]


class NoSpan:
    """What every hook hands out while tracing is off: one shared object doing nothing."""

    __slots__ = ()
    context = None  # the OpenTelemetry context a child would take (None: the caller's own)

    def add(self, *args: Any) -> None:
        """(A turn's or round's result, recorded when tracing is on.)"""

    def fail(self, error: BaseException) -> None:
        """(An error ending the span, recorded when tracing is on.)"""

    def rename(self, name: str) -> None:
        """(Renames the span when tracing is on.)"""

    def end(self) -> None:
        """(Ends the span when tracing is on.)"""


NO_SPAN = NoSpan()
_DETACHED = contextlib.nullcontext()


class ending:  # noqa: N801 - named like contextlib.closing, which it mirrors
    """`with tracing.ending(span):` a span's lifecycle in one place: on leaving the block an
    Exception raised in it is recorded on the span (`fail`) and propagates, and the span ends
    (`end`, whatever happened: a cancellation or a closed generator ends it too, unrecorded).
    The block records its result itself (`span.add(result)`). Works on NO_SPAN as on a live span."""

    __slots__ = ("span",)

    def __init__(self, span: Any) -> None:
        self.span = span

    def __enter__(self) -> Any:
        return self.span

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        try:
            if isinstance(error, Exception):
                self.span.fail(error)
        finally:
            self.span.end()


class _Switch:
    """The process's tracing state: `spans` is None (off) or the spans.Spans that makes spans.
    One per process, like OpenTelemetry's own global TracerProvider; set by enable()/disable()."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: Spans | None = None


SWITCH = _Switch()


def enable(tracer_provider: Any = None) -> None:
    """Trace agentrt from now on, into `tracer_provider` (default: OpenTelemetry's global one,
    looked up as each span starts, so a provider set later is honoured)."""
    try:
        from agentrt.tracing.spans import Spans
    except ImportError as e:
        raise ConfigError("tracing needs OpenTelemetry: pip install 'agentrt[otel]' "
                          f"(opentelemetry-api and -sdk); importing it failed: {e}") from None
    # a user-supplied OpenTelemetry provider: a third-party object, checked by what it offers
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise ConfigError("tracer_provider must be an OpenTelemetry TracerProvider (with get_tracer()) or "
                          f"None for the global one, got {type(tracer_provider).__name__}")
    SWITCH.spans = Spans(tracer_provider)


def disable() -> None:
    """Stop tracing (spans already started still end)."""
    SWITCH.spans = None


def is_enabled() -> bool:
    return SWITCH.spans is not None


# ---- hooks for the runtime (each a None check when off) ---------------------------------------
def capture() -> Any:
    """The current OpenTelemetry context, to hand to work that runs elsewhere (an actor's
    mailbox, the engine's loop); None when off."""
    spans = SWITCH.spans
    return None if spans is None else spans.capture()


def attached(context: Any) -> contextlib.AbstractContextManager:
    """Make `context` current for a block that starts and ends in one task (never across a
    yield); a no-op for None."""
    spans = SWITCH.spans
    return _DETACHED if spans is None or context is None else spans.attached(context)


def agent_turn(agent: str, engine: Any, parent: Any = None) -> Any:
    """The `invoke_agent` span of one turn (NO_SPAN when off); its `context` parents the turn's
    rounds and tool calls."""
    spans = SWITCH.spans
    return NO_SPAN if spans is None else spans.agent_turn(agent, engine, parent)


def chat(engine: Any, params: Any, parent: Any = None) -> Any:
    """The `chat` span of one generation round (NO_SPAN when off); `parent`: an OpenTelemetry
    context (default: the current one)."""
    spans = SWITCH.spans
    return NO_SPAN if spans is None else spans.chat(engine, params, parent)


def tool_call(tool: str, call_id: str, agent: str | None) -> Any:
    """The `execute_tool` span of one tool call, child of the current context (NO_SPAN when off)."""
    spans = SWITCH.spans
    return NO_SPAN if spans is None else spans.tool_call(tool, call_id, agent)


def http_request(method: str, path: str, headers: dict[str, str]) -> Any:
    """The SERVER span of one HTTP request, child of the W3C `traceparent` in `headers` (lower-case
    names) when there is one (NO_SPAN when off)."""
    spans = SWITCH.spans
    return NO_SPAN if spans is None else spans.http_request(method, path, headers)


def headers(context: Any) -> dict[str, str]:
    """The W3C trace headers (`traceparent`) that carry `context` to a peer ({} when off)."""
    spans = SWITCH.spans
    return {} if spans is None or context is None else spans.headers(context)


def add_trace_ids(logger: Any, method: str, event: dict) -> dict:
    """A structlog processor: `trace_id` and `span_id` (hex, as trace backends show them) of the
    current span, so log lines join their trace; nothing when off or outside a span.
    `structlog.configure(processors=[structlog.contextvars.merge_contextvars, add_trace_ids, ...])`."""
    spans = SWITCH.spans
    return event if spans is None else spans.add_ids(event)
