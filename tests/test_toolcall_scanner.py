"""The incremental JSON scanner accepts exactly what json.loads accepts, split anywhere."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.toolcall.scanner import END, ERROR, PIECE, START, JsonScanner
from tests.toolcall_harness import pieces_at


def _no_constants(name):
    raise ValueError(name)


def json_accepts(text: str) -> bool:
    try:
        json.loads(text, parse_constant=_no_constants)
    except ValueError:
        return False
    return True


def scan(pieces: list[str], *, watch_depth: int = 0, decode: bool = False):
    """Run the scanner over pieces; (outcome, tokens, decoded text) with outcome one of
    ('done', offset after the value), ('error', offset of the bad char), ('open', None)."""
    scanner, tokens, decoded, base = JsonScanner(watch_depth), [], [], 0
    for piece in pieces:
        i = 0
        while i < len(piece) and not (scanner.done or scanner.failed):
            i, tok = scanner.scan(piece, i)
            if tok is None:
                continue
            tokens.append(tok)
            if tok[0] is START and tok[2] in '"k' and decode:
                scanner.decode = True
            elif tok[0] is PIECE:
                decoded.append(tok[2])
            elif tok[0] is ERROR:
                return ("error", base + i), tokens, "".join(decoded)
        if scanner.done:
            return ("done", base + i), tokens, "".join(decoded)
        base += len(piece)
    return ("open", None), tokens, "".join(decoded)


def scanner_accepts(text: str, cuts=()) -> bool:
    # A trailing newline ends a bare number; it never changes what json.loads accepts.
    (outcome, end), _, _ = scan(pieces_at(text + "\n", cuts))
    return outcome == "done" and not text[end:].strip(" \t\n\r")


VALID = ['{}', '[]', '""', '0', '-0', '1.5e-3', '-12E+2', 'true', 'false', 'null',
         ' {"a" : [1, {"b": null}], "c": "\\u00e9"} ', '"\\ud83d\\ude00"', '"\\ud800"', '[[[[]]]]',
         '{"":""}', '"\\"\\\\\\/\\b\\f\\n\\r\\t"', '123456789012345678901234567890']
INVALID = ['', ' ', '{', '[1,]', '{"a":1,}', '{a:1}', "{'a':1}", '01', '-', '1.', '.5', '1e', '1e+', '+1',
           'tru', 'nul', 'NaN', 'Infinity', '-Infinity', '"\\x"', '"\\u12"', '"\\u12G4"', '"a\nb"', '"\t"',
           '[1 2]', '{"a" 1}',
           '{"a":}', '[1]]', '{} {}', '"abc', '[', '{"a":1', '1 2', '\u00a0 1', '[1,,2]', '{,}', '0x10']


@pytest.mark.parametrize("text", VALID + INVALID)
def test_agrees_with_json_loads_on_fixed_cases(text):
    assert scanner_accepts(text) == json_accepts(text)
    for k in range(len(text) + 1):
        assert scanner_accepts(text, [k]) == json_accepts(text)


_alphabet = st.sampled_from(
    list('{}[]":,\\ \n\t01-+.eEtrufalsn"ux/bAF9') + ["\\u00e9", "\\ud83d", "\\ude00", "\x01"])


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_alphabet, max_size=25), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_agrees_with_json_loads_on_random_text(parts, cuts):
    text = "".join(parts)
    assert scanner_accepts(text, [c for c in cuts if c <= len(text)]) == json_accepts(text)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=15)


@settings(max_examples=300, deadline=None)
@given(value=_json, indent=st.sampled_from([None, 1]), ensure_ascii=st.booleans(), data=st.data())
def test_accepts_every_dumped_value_with_balanced_tokens(value, indent, ensure_ascii, data):
    text = json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8))
    (outcome, end), tokens, _ = scan(pieces_at(text + " ", cuts), watch_depth=99)
    assert (outcome, end) == ("done", len(text))
    starts = [t for t in tokens if t[0] is START]
    ends = [t for t in tokens if t[0] is END]
    assert len(starts) == len(ends) and [t[1] for t in starts].count(0) == 1


_any_char = st.characters(blacklist_categories=())  # includes lone surrogates


@settings(max_examples=400, deadline=None)
@given(s=st.text(alphabet=_any_char, max_size=40), ensure_ascii=st.booleans(), data=st.data())
def test_string_decoding_matches_json_loads(s, ensure_ascii, data):
    text = json.dumps(s, ensure_ascii=ensure_ascii)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    (outcome, end), _, decoded = scan(pieces_at(text, cuts), decode=True)
    assert (outcome, end) == ("done", len(text))
    assert decoded == json.loads(text)


def test_error_offset_is_the_first_impossible_character():
    for text, bad in [('{"a": [1, 2,]}', 12), ('{"a" 1}', 5), ('"ab\\q"', 4), ('[tru]', 4), ('[01]', 2),
                      ('{"k": "v\u0001"}', 8), ('[1.e3]', 3), ('{"a": nan}', 7)]:
        for k in range(len(text) + 1):
            (outcome, at), _, _ = scan(pieces_at(text, [k]))
            assert (outcome, at) == ("error", bad), (text, k)
            assert not json_accepts(text)


def test_watch_depth_limits_reported_tokens():
    text = '{"a": [1, {"b": "c"}], "d": 2}'
    (_, _), tokens, _ = scan([text], watch_depth=1)
    assert [(t[0], t[1], t[2]) for t in tokens] == [
        (START, 0, "{"), (START, 1, "k"), (END, 1, "k"), (START, 1, "["), (END, 1, "["),
        (START, 1, "k"), (END, 1, "k"), (START, 1, "0"), (END, 1, "0"), (END, 0, "{")]


def test_steps_are_linear_for_one_character_pieces():
    text = json.dumps({"k": ["x" * 50, {"y": [1, 2.5, None, True]}] * 2000})
    scanner = JsonScanner()
    for ch in text + " ":
        i = 0
        while i < 1 and not scanner.done:
            i, _ = scanner.scan(ch, i)
    assert scanner.done and scanner.steps <= 2 * len(text)
