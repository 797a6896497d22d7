"""Shared tools, corpus and helpers for the tool-call parser tests."""

from __future__ import annotations

import json
from dataclasses import dataclass

from agentrt.toolcall import (
    ArgumentsDelta,
    CallComplete,
    CallInvalid,
    CallStarted,
    EarlyStop,
    TextDelta,
    ToolCallParser,
    load_tool_specs,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"

TOOLS = {
    "get_weather": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "search": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1},
            "filters": {
                "type": "object",
                "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
            },
        },
        "required": ["query"],
    },
    "get_time": {"type": "object", "properties": {}},
}

SPECS = load_tool_specs(TOOLS)  # compiled once; parsers reuse it


def call(name: str, args: str | None = '{"city": "Paris"}', key: str = "arguments") -> str:
    """A call object's JSON text with `args` as the raw arguments value (None: no arguments)."""
    if args is None:
        return '{"name": %s}' % json.dumps(name)
    return '{"name": %s, "%s": %s}' % (json.dumps(name), key, args)


def tag(body: str) -> str:
    return OPEN + body + CLOSE


W = call("get_weather")
S = call("search", '{"query": "q"}')

CORPUS: list[tuple[str, str]] = [
    # valid calls
    ("single", tag(W)),
    ("qwen_newlines", tag("\n" + call("get_weather", '{"city": "Paris", "unit": "c"}') + "\n")),
    ("prose_then_call", "Let me check the weather.\n" + tag(W)),
    ("two_calls", tag(W) + "\n" + tag(S)),
    ("list_in_tag", tag("[" + W + ", " + S + "]")),
    ("list_in_tag_spaced", tag("\n[\n  " + W + " ,\n  " + S + "\n]\n")),
    ("parameters_alias", tag(call("get_weather", '{"city": "Oslo"}', key="parameters"))),
    ("arguments_as_string", tag(call("get_weather", json.dumps(json.dumps({"city": "Caf\u00e9 \"X\""}))))),
    ("string_args_escapes", tag(call("search", json.dumps('{"query": "a\\\\b \\u00e9 {]"}')))),
    ("braces_in_strings", tag(call("search", r'{"query": "a } b ] c { [ \" q \"}\" ]"}'))),
    ("backslashes", tag(call("search", r'{"query": "C:\\path\\to\\", "x": "\\\""}'))),
    ("unicode_escapes",
     tag(call("search", r'{"query": "caf\u00e9 \ud83d\ude00 \u4E2D \ud800 x\/y\b\f\n\r\t"}'))),
    ("raw_unicode", tag(call("search", '{"query": "na\u00efve \u6771\u4eac \U0001F600"}'))),
    ("close_tag_in_string", tag(call("search", '{"query": "literal </tool_call> and <tool_call> inside"}'))),
    ("nested", tag(call("search", '{"query": "q", "filters": {"tags": ["a", "b"]}, '
                                  '"deep": [[{"x": [1, {"y": {}}]}], []]}'))),
    ("whitespace", tag('\t{ "name" : "get_time" ,\r\n "arguments" : { } }\n')),
    ("no_arguments", tag(call("get_time", None))),
    ("args_before_name", tag('{"arguments": {"city": "Paris"}, "name": "get_weather"}')),
    ("extra_keys",
     tag('{"id": "call_1", "type": "function", "name": "get_weather", "arguments": {"city": "Rome"}}')),
    ("numbers", tag(call("search", '{"query": "q", "a": -12.5e+3, "b": 0, "c": 1E5, "d": 0.25, "e": -0}'))),
    ("literals", tag(call("search", '{"query": "q", "t": true, "f": false, "n": null}'))),
    ("escaped_key", tag('{"n\\u0061me": "get_time", "arguments": {}}')),
    ("escaped_name", tag('{"name": "get\\u005ftime", "arguments": {}}')),
    ("bare", W),
    ("bare_ws", "  \n" + W + "\n"),
    ("bare_list", "[" + W + ", " + S + "]"),
    ("bare_two", W + "\n" + S),
    ("bare_then_prose", W + "\nDone."),
    ("prose_only", "Hello there, no tools needed."),
    ("prose_lt", "a < b and <tool but <tool_cal not a tag; <<tool_call"),
    ("prose_partial_end", "almost a tag <tool_c"),
    ("prose_after_call", tag(W) + "\nIt is sunny."),
    ("prose_lt_after_call", tag(W) + "\n<b>bold</b>"),
    ("partial_open_after_call", tag(W) + "\n<tool_ca"),
    ("partial_close", OPEN + W + "</tool_ca"),
    ("empty", ""),
    ("spaces", "   \n "),
    ("brace_prose", "{not json at all} said the model"),
    ("string_root_json", '"just a string"'),
    # invalid calls
    ("unknown_name", tag(call("delete_everything", '{"x": 1}'))),
    ("unknown_then_valid", tag(call("nope")) + tag(W)),
    ("missing_brace", OPEN + '{"name": "get_weather", "arguments": {"city": "Paris"}' + CLOSE),
    ("single_quotes", tag("{'name': 'get_weather', 'arguments': {}}")),
    ("trailing_comma", tag('{"name": "get_time", "arguments": {},}')),
    ("unquoted_key", tag('{name: "get_time"}')),
    ("not_json", tag("not json")),
    ("nan_value", tag(call("search", '{"query": "q", "x": NaN}'))),
    ("invalid_escape", tag(call("search", r'{"query": "\x41"}'))),
    ("bad_unicode_escape", tag(call("search", r'{"query": "\u12G4"}'))),
    ("raw_newline_in_string", tag(call("search", '{"query": "line\nbreak"}'))),
    ("leading_zero", tag(call("search", '{"query": "q", "n": 01}'))),
    ("bad_literal", tag(call("search", '{"query": "q", "n": nul}'))),
    ("unknown_then_malformed", tag('{"name": "nope", "arguments": {oops}}')),
    ("missing_name", tag('{"arguments": {"city": "Paris"}}')),
    ("name_not_string", tag('{"name": 5, "arguments": {}}')),
    ("args_list", tag(call("get_weather", "[1, 2]"))),
    ("args_null", tag(call("get_weather", "null"))),
    ("args_number", tag(call("get_weather", "12"))),
    ("args_string_not_json", tag(call("get_weather", '"not json"'))),
    ("args_string_list", tag(call("get_weather", '"[1]"'))),
    ("schema_missing", tag(call("get_weather", "{}"))),
    ("schema_type", tag(call("get_weather", '{"city": 3}'))),
    ("schema_extra", tag(call("get_weather", '{"city": "x", "zip": 1}'))),
    ("schema_enum", tag(call("get_weather", '{"city": "x", "unit": "k"}'))),
    ("schema_nested", tag(call("search", '{"query": "q", "filters": {"tags": [1]}}'))),
    ("list_non_object", tag("[" + W + ", 5]")),
    ("list_string", tag('["get_time"]')),
    ("dup_name", tag('{"name": "get_time", "name": "get_time"}')),
    ("dup_args", tag('{"name": "get_time", "arguments": {}, "parameters": {}}')),
    ("list_missing_bracket", tag("[" + W) + "\n" + tag(S)),
    ("junk_after_json", tag(W + "}")),
    ("empty_tag", tag("")),
    ("bare_malformed", '{"name": "get_time", "arguments": {]}'),
    ("bare_list_junk", "[" + W + " x]"),
    ("json_list_number", "[1, 2]"),
]


@dataclass
class Run:
    events: list  # normalised: adjacent text / same-index argument deltas merged
    stop_offset: int | None
    fed_after_stop: list  # events returned by feeds after should_stop turned true


def normalise(events: list) -> list:
    out: list = []
    for ev in events:
        prev = out[-1] if out else None
        if isinstance(ev, TextDelta) and isinstance(prev, TextDelta):
            out[-1] = TextDelta(prev.text + ev.text)
        elif isinstance(ev, ArgumentsDelta) and isinstance(prev, ArgumentsDelta) and prev.index == ev.index:
            out[-1] = ArgumentsDelta(ev.index, prev.text + ev.text)
        else:
            out.append(ev)
    return out


def pieces_at(message: str, cuts) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(message)]
    return [message[a:b] for a, b in zip(bounds, bounds[1:])]


def run(pieces: list[str], **options) -> Run:
    parser = ToolCallParser(SPECS, **options)
    events, after = [], []
    for piece in pieces:
        stopped = parser.should_stop
        got = parser.feed(piece)
        (after if stopped else events).extend(got)
    events.extend(parser.close())
    check_invariants(events)
    return Run(normalise(events), parser.stop_offset, after)


def text_of(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def verdicts_of(events: list) -> list:
    return [e for e in events if isinstance(e, (CallComplete, CallInvalid))]


def check_invariants(events: list) -> None:
    """The ordering / content contract of toolcall/parse_events.py, for one complete event stream."""
    started: dict[int, str] = {}
    args: dict[int, str] = {}
    judged: set[int] = set()
    for k, ev in enumerate(events):
        if isinstance(ev, EarlyStop):
            assert all(not isinstance(e, EarlyStop) for e in events[k + 1:])
            assert not any(isinstance(e, (TextDelta, ArgumentsDelta, CallStarted)) for e in events[k + 1:])
        elif isinstance(ev, CallStarted):
            assert ev.index not in started and ev.index not in judged and ev.name in TOOLS
            started[ev.index] = ev.name
        elif isinstance(ev, ArgumentsDelta):
            assert ev.index in started and ev.index not in judged
            args[ev.index] = args.get(ev.index, "") + ev.text
        elif isinstance(ev, (CallComplete, CallInvalid)):
            assert ev.index not in judged
            judged.add(ev.index)
    verdicts = verdicts_of(events)
    assert [v.index for v in verdicts] == list(range(len(verdicts)))
    for v in verdicts:
        if isinstance(v, CallComplete):
            assert started[v.index] == v.name
            assert json.loads(args[v.index]) == v.arguments
            assert json.loads(v.raw)["name"] == v.name
