"""The streaming tool-call parser agrees with json.loads + jsonschema, however the input is split.

Oracle: tests/toolcall_oracle.py reads each complete message with json's own decoder and
validates with jsonschema. Split invariance: feeding a message whole, one character at a
time, split at every single point, or at random points gives the identical (normalised)
event stream and stop offset.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentrt.toolcall import CallComplete, CallInvalid, InvalidKind, TextDelta
from tests.toolcall_harness import CORPUS, OPEN, TOOLS, call, pieces_at, run, tag, text_of, verdicts_of
from tests.toolcall_oracle import COMPLETE, reference

WRAPPERS = ("hermes", "json", "auto")
CASES = [pytest.param(msg, id=name) for name, msg in CORPUS]


def verdict_summary(events: list) -> list:
    """(kind, name, arguments) per verdict; names only where the oracle can know them."""
    out = []
    for v in verdicts_of(events):
        if isinstance(v, CallComplete):
            out.append((COMPLETE, v.name, v.arguments))
        else:
            out.append((str(v.kind), v.name if v.kind is InvalidKind.UNKNOWN_TOOL else None, None))
    return out


def oracle_summary(expected) -> list:
    return [(k, n if k in (COMPLETE, "unknown_tool") else None, a) for k, n, a in expected.verdicts]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("message", CASES)
def test_whole_message_agrees_with_oracle(message, wrapper):
    expected = reference(message, TOOLS, wrapper)
    got = run([message], wrapper=wrapper)
    assert verdict_summary(got.events) == oracle_summary(expected)
    assert text_of(got.events) == expected.text
    assert (got.stop_offset is not None) == expected.stopped


def parsing_wrappers(message: str) -> list[str]:
    """The wrappers under which `message` is more than plain text (the others are trivial)."""
    bare = message.lstrip(" \t\n\r")[:1]
    chosen = ["hermes"] if OPEN[:5] in message else []
    chosen += ["json"] if bare in ("{", "[") else []
    return chosen + ["auto"] if chosen or not message else ["auto"]


@pytest.mark.parametrize("message", CASES)
def test_every_split_gives_the_same_events(message):
    for wrapper in parsing_wrappers(message):
        whole = run([message], wrapper=wrapper)
        by_char = run(list(message), wrapper=wrapper)
        assert (by_char.events, by_char.stop_offset) == (whole.events, whole.stop_offset)
        assert by_char.fed_after_stop == []
        for k in range(1, len(message)):
            split = run([message[:k], message[k:]], wrapper=wrapper)
            assert (split.events, split.stop_offset) == (whole.events, whole.stop_offset), (wrapper, k)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_multi_splits(data):
    message = data.draw(st.sampled_from([m for _, m in CORPUS]))
    wrapper = data.draw(st.sampled_from(WRAPPERS))
    cuts = data.draw(st.lists(st.integers(0, len(message)), max_size=20))
    whole = run([message], wrapper=wrapper)
    split = run(pieces_at(message, cuts), wrapper=wrapper)
    assert (split.events, split.stop_offset) == (whole.events, whole.stop_offset)


@pytest.mark.parametrize("message", CASES)
def test_prefix_streams_are_consistent(message):
    """A stream cut short emits the full stream's verdicts so far, then maybe INCOMPLETE."""
    wrapper = "json" if message.startswith("[") else "auto"
    full = verdicts_of(run([message], wrapper=wrapper).events)
    for k in range(len(message)):
        got = verdicts_of(run([message[:k]], wrapper=wrapper).events)
        cut_short = bool(got) and getattr(got[-1], "kind", None) is InvalidKind.INCOMPLETE
        same = len(got) - cut_short
        assert got[:same] == full[:same] and same <= len(full), k


# -- generated arguments --------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.text(max_size=12) | st.floats(
    allow_nan=False, allow_infinity=False)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
_tricky_chars = st.sampled_from(list('{}[]",:\\/ \n\tab\u00e9\U0001F600<>_')) | st.characters()
_tricky_text = st.text(alphabet=_tricky_chars, max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=_tricky_text, extra=st.dictionaries(st.text(max_size=6), _json, max_size=3),
       ensure_ascii=st.booleans(), indent=st.sampled_from([None, 0, 2]),
       form=st.sampled_from(["tag", "tag_list", "bare", "bare_list", "string_args", "alias"]),
       prose=_tricky_text.filter(lambda t: OPEN not in t), data=st.data())
def test_generated_arguments(query, extra, ensure_ascii, indent, form, prose, data):
    args = {**extra, "query": query}
    args_json = json.dumps(args, ensure_ascii=ensure_ascii, indent=indent)
    key = "parameters" if form == "alias" else "arguments"
    if form == "string_args":
        args_json = json.dumps(args_json, ensure_ascii=ensure_ascii)
    body = call("search", args_json, key=key)
    wrapper, message = {
        "tag": ("hermes", prose + tag(body)), "alias": ("auto", prose + tag(body)),
        "string_args": ("hermes", prose + tag(body)), "tag_list": ("hermes", prose + tag(f"[{body}]")),
        "bare": ("auto", "\n " + body), "bare_list": ("json", f"[{body}]"),
    }[form]
    # (in auto mode a message that opens with a JSON object or list, or a fence, is a bare call by
    # design: prose like that before a tag is not prose there)
    assume(not (wrapper == "auto" and form != "bare" and prose.lstrip().startswith(("{", "[", "`"))))
    cuts = data.draw(st.lists(st.integers(0, len(message)), max_size=10))
    got = run(pieces_at(message, cuts), wrapper=wrapper)
    try:
        jsonschema.validate(json.loads(json.dumps(args)), TOOLS["search"])
        expected = (COMPLETE, "search", json.loads(json.dumps(args)))
    except jsonschema.ValidationError:
        expected = ("schema_violation", None, None)
    assert verdict_summary(got.events) == [expected]
    assert text_of(got.events) == (prose if form in ("tag", "alias", "string_args", "tag_list") else "")


def test_unicode_and_surrogates_survive_any_split():
    query = "caf\u00e9 \U0001F600 \ud800 lone, \udc00 low, pair \ud83d\ude00 end"
    for ensure_ascii in (True, False):
        body = call("search", json.dumps({"query": query}, ensure_ascii=ensure_ascii))
        message = tag(body)
        expected = json.loads(body)["arguments"]  # json pairs only *escaped* surrogates
        assert (expected["query"] == query.replace("\ud83d\ude00", "\U0001F600")) is ensure_ascii
        for k in range(len(message)):
            (verdict,) = verdicts_of(run([message[:k], message[k:]], wrapper="hermes").events)
            assert isinstance(verdict, CallComplete) and verdict.arguments == expected


def test_text_is_never_held_longer_than_a_tag_prefix():
    from agentrt.toolcall import ToolCallParser

    parser = ToolCallParser(TOOLS, wrapper="hermes")
    assert parser.feed("Hi <tool") == [TextDelta("Hi ")]
    assert parser.feed("box> ok") == [TextDelta("<toolbox> ok")]
    assert parser.feed("<") == []
    assert parser.close() == [TextDelta("<")]


def test_invalid_reason_mentions_schema_path():
    (verdict,) = verdicts_of(run([tag(call("search", '{"query": "q", "filters": {"tags": [1]}}'))]).events)
    assert isinstance(verdict, CallInvalid) and verdict.kind is InvalidKind.SCHEMA_VIOLATION
    assert "$.filters.tags[0]" in verdict.reason and "is not of type 'string'" in verdict.reason
