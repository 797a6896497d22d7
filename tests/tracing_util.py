"""Helpers of the tracing tests: tracing on into an in-memory exporter, and the span tree."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentrt import tracing


@contextlib.contextmanager
def traced() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    """Tracing on into a fresh provider and exporter (off again after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter, provider
    finally:
        tracing.disable()


def tree(exporter) -> tuple[dict, dict]:
    """(span id -> span, span id -> its children's names in start order)."""
    by_id = {s.context.span_id: s for s in exporter.get_finished_spans()}
    kids: dict = {i: [] for i in by_id}
    for s in sorted(by_id.values(), key=lambda s: s.start_time):
        if s.parent is not None and s.parent.span_id in kids:
            kids[s.parent.span_id].append(s.name)
    return by_id, kids


def named(exporter, prefix: str) -> list:
    """The finished spans whose name starts with `prefix`, in start order."""
    return sorted((s for s in exporter.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time)


def parent_of(span, by_id):
    return by_id.get(span.parent.span_id) if span.parent is not None else None
