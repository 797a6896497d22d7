"""Early stop happens exactly at the documented character; truncation; linear work."""

from __future__ import annotations

import pytest

from agentrt.toolcall import (
    ArgumentsDelta,
    CallComplete,
    CallInvalid,
    CallStarted,
    EarlyStop,
    InvalidKind,
    ParserState,
    ToolCallParser,
)
from tests.toolcall_harness import CLOSE, CORPUS, OPEN, SPECS, TOOLS, S, W, call, run, tag, verdicts_of
from tests.toolcall_oracle import COMPLETE, reference


def stop_index(message: str, **options) -> tuple[int | None, list]:
    """Feed one character at a time; the index of the character after which should_stop
    first turned true (None: never), and all events."""
    parser = ToolCallParser(SPECS, **options)
    events, first = [], None
    for k, ch in enumerate(message):
        got = parser.feed(ch)
        if first is None and parser.should_stop:
            first = k
            assert parser.stop_offset == k + 1 and isinstance(got[-1], EarlyStop)
        elif first is not None:
            assert got == []  # input after the stop point is ignored
        events += got
    events += parser.close()
    assert sum(isinstance(e, EarlyStop) for e in events) == (first is not None)
    return first, events


def single_call_cases():
    for name, message in CORPUS:
        for wrapper in ("hermes", "json", "auto"):
            expected = reference(message, TOOLS, wrapper)
            if expected.verdicts and expected.verdicts[0][0] == COMPLETE:
                yield pytest.param(message, wrapper, expected.ends[0], id=f"{name}-{wrapper}")


@pytest.mark.parametrize("message,wrapper,end", list(single_call_cases()))
def test_single_call_mode_stops_at_the_call_objects_closing_brace(message, wrapper, end):
    first, events = stop_index(message, wrapper=wrapper, parallel_calls=False)
    assert message[first] == "}" and first == end - 1  # end: json.raw_decode's end of the object
    assert isinstance(verdicts_of(events)[-1], CallComplete) and len(verdicts_of(events)) == 1


@pytest.mark.parametrize("message,wrapper,stop_char_at", [
    (tag(W) + "\n  It is sunny.", "hermes", "I"),
    (tag(W) + "\n<b>bold</b>", "auto", "b"),  # '<' alone could still open a tag
    (tag(W) + "\n" + tag(S) + " ok", "hermes", "o"),
    (tag(W) + "</tool_call>", "hermes", "/"),
    (tag(W + " x"), "hermes", "x"),  # junk inside the tag after the call JSON
    (W + "\nDone.", "auto", "D"),
    (W + " " + S + "]", "json", "]"),
    ("[" + W + ", " + S + "]\nmore", "json", "]"),  # a bare list closes the message
])
def test_parallel_mode_stops_at_the_first_character_that_cannot_start_a_call(message, wrapper, stop_char_at):
    first, events = stop_index(message, wrapper=wrapper)
    tail = message[first:]
    assert message[first] == stop_char_at and message[:first].rstrip().endswith((">", "}", "<", "]"))
    assert tail.strip()  # something non-blank triggered it
    assert all(isinstance(v, CallComplete) for v in verdicts_of(events))


@pytest.mark.parametrize("message", [tag(W) + "\n" + tag(S) + "\n\n", W + "\n" + S, tag(W) + " <tool_c"])
def test_parallel_mode_does_not_stop_while_more_calls_may_follow(message):
    first, events = stop_index(message, wrapper="auto")
    assert first is None and all(isinstance(v, CallComplete) for v in verdicts_of(events))


def test_max_calls_stops_at_the_last_allowed_calls_brace():
    message = tag(W) + tag(S) + tag(call("get_time", "{}"))
    first, events = stop_index(message, wrapper="hermes", max_calls=2)
    assert first == 2 * len(OPEN) + len(W) + len(CLOSE) + len(S) - 1
    assert [v.name for v in verdicts_of(events)] == ["get_weather", "search"]


def test_unknown_name_is_rejected_when_its_string_closes():
    message = tag(call("rm_rf", '{"path": "/"}'))
    first, events = stop_index(message, wrapper="hermes")
    assert first == message.index('"rm_rf"') + len('"rm_rf"') - 1  # the closing quote
    (verdict,) = verdicts_of(events)
    assert verdict.kind is InvalidKind.UNKNOWN_TOOL and verdict.name == "rm_rf"
    assert verdict.raw == '{"name": "rm_rf"'
    assert not any(isinstance(e, (CallStarted, ArgumentsDelta)) for e in events)


def test_unknown_name_after_the_arguments_drops_the_buffered_arguments():
    message = tag('{"arguments": {"path": "/"}, "name": "rm_rf"}')
    first, events = stop_index(message, wrapper="hermes")
    assert first == message.index('"rm_rf"') + len('"rm_rf"') - 1
    assert not any(isinstance(e, (CallStarted, ArgumentsDelta)) for e in events)


def test_call_started_as_soon_as_a_declared_name_closes():
    message = tag(W)
    parser = ToolCallParser(SPECS, wrapper="hermes")
    close_quote = message.index('"get_weather"') + len('"get_weather"') - 1
    for k, ch in enumerate(message):
        got = parser.feed(ch)
        assert (CallStarted(0, "get_weather") in got) is (k == close_quote)


@pytest.mark.parametrize("message,wrapper,kinds,stops", [
    (tag(call("nope")) + tag(W), "hermes", ["unknown_tool", COMPLETE], False),
    (tag('{"name": "get_weather", "arguments": {oops}}') + "\n" + tag(S), "hermes",
     ["malformed_json", COMPLETE], False),
    (tag("[" + call("nope", '{"a": [1, {"b": "}"}]}') + ", " + W + "]"), "hermes",
     ["unknown_tool", COMPLETE], False),
    ("[" + call("nope", '{"a": "]"}') + ", 7, " + W + "]", "json",
     ["unknown_tool", "bad_call", COMPLETE], True),
    ('{"name": "get_time", "arguments": {]}' + S, "json", ["malformed_json"], True),
])
def test_stop_on_invalid_false_keeps_parsing(message, wrapper, kinds, stops):
    got = run(list(message), wrapper=wrapper, stop_on_invalid=False)
    verdicts = verdicts_of(got.events)
    assert [COMPLETE if isinstance(v, CallComplete) else str(v.kind) for v in verdicts] == kinds
    assert (got.stop_offset is not None) == stops
    assert run([message], wrapper=wrapper, stop_on_invalid=False).events == got.events


@pytest.mark.parametrize("message,name,raw", [
    (OPEN, None, ""),
    (OPEN + "\n  ", None, ""),
    (OPEN + '{"name": "get_weather", "argu', "get_weather", '{"name": "get_weather", "argu'),
    (OPEN + '[{"name": "get_time"}, {"name": "get_ti', None, '{"name": "get_ti'),
    (W[:-3], "get_weather", W[:-3]),
    ('{"name": "get_weather", "arguments": {"city": 12', "get_weather", None),
])
def test_stream_ending_inside_a_call_is_incomplete(message, name, raw):
    got = run(list(message), wrapper="auto")
    verdict = verdicts_of(got.events)[-1]
    assert isinstance(verdict, CallInvalid) and verdict.kind is InvalidKind.INCOMPLETE
    assert verdict.name == name and (raw is None or verdict.raw == raw)
    assert got.stop_offset is None


def test_states_follow_the_message():
    parser = ToolCallParser(SPECS, wrapper="auto")
    assert parser.state is ParserState.MESSAGE_START
    parser.feed("  ")
    assert parser.state is ParserState.MESSAGE_START
    parser.feed("Hi <tool_call>")
    assert parser.state is ParserState.IN_CALL
    parser.feed(W)
    assert parser.state is ParserState.CLOSING_TAG
    parser.feed("</tool_call>\n")
    assert parser.state is ParserState.BETWEEN_CALLS and not parser.should_stop
    parser.feed("Bye")
    assert parser.state is ParserState.STOPPED and parser.should_stop
    assert parser.close() == [] and parser.state is ParserState.CLOSED
    assert parser.close() == []


@pytest.mark.slow
def test_one_megabyte_fed_one_character_at_a_time_is_linear():
    unit = '"a{b}[c]\\"\\\\\\u00e9 </tool_call> x", [1, -2.5e3, true, null, {"k": "v"}], '
    blob = unit * (1_000_000 // len(unit))
    message = "Prose < with <b> tags.\n" + tag(call("search", '{"query": "q", "blob": [' + blob + "0]}"))
    parser = ToolCallParser(SPECS, wrapper="hermes")
    checkpoints, args, verdicts, worst, before = [], [], [], 0, 0
    for k, ch in enumerate(message):
        for event in parser.feed(ch):
            if isinstance(event, ArgumentsDelta):
                args.append(event.text)
            elif isinstance(event, (CallComplete, CallInvalid)):
                verdicts.append(event)
        worst, before = max(worst, parser.steps - before), parser.steps
        if k % 100_000 == 0:
            checkpoints.append(parser.steps)
    assert worst <= 4  # each 1-character feed does a bounded amount of work
    per_100k = [b - a for a, b in zip(checkpoints, checkpoints[1:])]
    assert max(per_100k) <= 1.2 * min(per_100k)  # no growth with the amount already buffered
    assert parser.steps <= 3 * len(message)
    assert "".join(args) == '{"query": "q", "blob": [' + blob + "0]}"
    assert [type(v) for v in verdicts] == [CallComplete] and len(verdicts[0].arguments["blob"]) > 10_000
