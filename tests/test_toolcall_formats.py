"""Tool-call formats per model family: the parser reads each family's calls for every split of
the text (two cuts anywhere, compared with one whole feed and with the expected calls)."""

from __future__ import annotations

import itertools

import pytest

from agentrt.errors import ConfigError
from agentrt.toolcall import CallComplete, CallInvalid
from agentrt.toolcall.formats import FORMATS, HERMES, LLAMA3, MISTRAL, QWEN, ToolFormat
from tests.toolcall_harness import pieces_at, run, text_of, verdicts_of

PARIS = ("get_weather", {"city": "Paris"})
ROME = ("get_weather", {"city": "Rome", "unit": "c"})


def every_split(message: str, **options):
    """Runs for all splits into up to three pieces; they must all agree; returns one."""
    whole = run([message], **options)
    n = len(message)
    cuts = [(i, j) for i in range(n + 1) for j in range(i, n + 1)] if n <= 90 else \
        [(i, i) for i in range(n + 1)]
    for i, j in cuts:
        got = run(pieces_at(message, (i, j)), **options)
        assert got.events == whole.events, (i, j)
        assert got.stop_offset == whole.stop_offset
    return whole


def calls_of(r) -> list[tuple[str, dict]]:
    return [(v.name, v.arguments) for v in verdicts_of(r.events) if isinstance(v, CallComplete)]


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
def test_each_format_reads_its_own_calls(fmt: ToolFormat):
    calls = [PARIS, ROME] if fmt.parallel else [PARIS]
    r = every_split(fmt.render_calls(calls), **fmt.parser_options())
    assert calls_of(r) == calls
    assert text_of(r.events) == ""


def test_qwen_whitespace_and_text_before_calls():
    msg = "Let me check.\n" + QWEN.render_calls([PARIS, ROME])
    assert "<tool_call>\n{" in msg and "}\n</tool_call>" in msg
    r = every_split(msg, **QWEN.parser_options())
    assert calls_of(r) == [PARIS, ROME] and text_of(r.events) == "Let me check.\n"


@pytest.mark.parametrize("msg", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '  \n{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n',
    '\n```json\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n```',
])
@pytest.mark.parametrize("fmt", [HERMES, QWEN, LLAMA3], ids=["hermes", "qwen", "llama3"])
def test_auto_finds_bare_and_fenced_calls(fmt, msg):
    r = every_split(msg, **fmt.parser_options())
    assert calls_of(r) == [PARIS] and text_of(r.events) == ""


@pytest.mark.parametrize("msg", ["```python\nprint(1)\n```", "Use ``` fences.", "`x` is {not json}", "``"])
def test_fences_that_hold_no_call_are_text(msg):
    r = every_split(msg, **QWEN.parser_options())
    assert text_of(r.events) == msg and verdicts_of(r.events) == []


def test_two_fenced_calls_and_text_after_them():
    one = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
    two = '```json\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}\n```'
    r = every_split(one + "\n" + two, **HERMES.parser_options())
    assert calls_of(r) == [PARIS, ROME]
    r = every_split(one + "\nDone.", **HERMES.parser_options())
    assert calls_of(r) == [PARIS] and r.stop_offset is not None and text_of(r.events) == ""


def test_bare_calls_are_off_when_the_format_says_so():
    msg = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    r = every_split(msg, **MISTRAL.parser_options())
    assert text_of(r.events) == msg and verdicts_of(r.events) == []


def test_mistral_invalid_call_in_the_list_stops():
    msg = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"town": "Paris"}}, {"name": "x"}]'
    r = every_split(msg, **MISTRAL.parser_options())
    verdicts = verdicts_of(r.events)
    assert isinstance(verdicts[0], CallInvalid) and r.stop_offset is not None


def test_mistral_text_then_calls():
    msg = "Sure. " + MISTRAL.render_calls([PARIS])
    r = every_split(msg, **MISTRAL.parser_options())
    assert calls_of(r) == [PARIS] and text_of(r.events) == "Sure. "


def test_format_validation():
    with pytest.raises(ConfigError):
        ToolFormat("bad", open="<<x>")
    with pytest.raises(ConfigError):
        ToolFormat("bad", args_key="args")


def test_every_split_helper_covers_three_pieces():
    assert len(list(itertools.islice(pieces_at("abcdef", (2, 4)), 5))) == 3
