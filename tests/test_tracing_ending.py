"""`tracing.ending`: the one span lifecycle of an agent turn, a round and a tool call (no
OpenTelemetry needed: a recording span stands in)."""

from __future__ import annotations

import pytest

from agentrt import tracing


class Recorder:
    def __init__(self) -> None:
        self.log: list[object] = []

    def add(self, result: object) -> None:
        self.log.append(("add", result))

    def fail(self, error: BaseException) -> None:
        self.log.append(("fail", type(error).__name__))

    def end(self) -> None:
        self.log.append("end")


def test_a_block_that_returns_ends_the_span_after_its_result():
    span = Recorder()
    with tracing.ending(span) as s:
        s.add(7)
    assert span.log == [("add", 7), "end"]


def test_an_exception_is_recorded_then_the_span_ends_and_the_exception_propagates():
    span = Recorder()
    with pytest.raises(ValueError), tracing.ending(span):
        raise ValueError("x")
    assert span.log == [("fail", "ValueError"), "end"]


def test_a_closed_generator_ends_the_span_unrecorded():
    span = Recorder()

    def gen():
        with tracing.ending(span):
            yield 1
            span.add("never")

    g = gen()
    next(g)
    g.close()  # GeneratorExit, like a cancellation: no error recorded
    assert span.log == ["end"]


def test_the_no_span_takes_the_same_block():
    with tracing.ending(tracing.NO_SPAN) as s:
        s.add(1)
    with pytest.raises(KeyError), tracing.ending(tracing.NO_SPAN):
        raise KeyError("k")
