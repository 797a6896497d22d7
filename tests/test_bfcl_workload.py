"""The BFCL v4 multi-turn workload: entries replayed from the bfcl-eval wheel's ground truth."""

from __future__ import annotations

import json
import re

import pytest
from jsonschema import Draft202012Validator

from bench.workloads import bfcl


@pytest.fixture(scope="module")
def wheel():
    """The cached bfcl-eval wheel (downloaded once), or a skip when it can't be had."""
    try:
        return bfcl.bfcl_wheel()
    except RuntimeError as exc:
        pytest.skip(f"bfcl-eval wheel not cached and not downloadable: {exc}")


@pytest.fixture(scope="module")
def entries(wheel):
    """Every eligible multi_turn_base entry, replayed."""
    return bfcl.load_bfcl(1000, seed=0, wheel=wheel)


def _calls(entry):
    """(call, tool message) pairs of an entry, in order."""
    return [(c, m) for t in entry.turns for cs, ms in t.rounds for c, m in zip(cs, ms)]


def test_schema_conversion_maps_bfcl_type_names():
    schema = bfcl._json_schema({"type": "dict", "properties": {
        "a": {"type": "float"}, "b": {"type": "tuple", "items": {"type": "dict"}},
        "c": {"type": "any", "description": "anything"}}, "required": ["a"]})
    assert schema == {"type": "object", "required": ["a"], "properties": {
        "a": {"type": "number"}, "b": {"type": "array", "items": {"type": "object"}},
        "c": {"description": "anything"}}}
    Draft202012Validator.check_schema(schema)


def test_call_parsing_takes_literals_only():
    assert bfcl._parse_call("sort('a.txt')") == ("sort", ["a.txt"], {})
    assert bfcl._parse_call("mean(numbers=[1, 2.5])") == ("mean", [], {"numbers": [1, 2.5]})
    with pytest.raises(ValueError):
        bfcl._parse_call("cd(folder=__import__('os').getcwd())")


def test_deterministic_for_a_seed(wheel):
    a = bfcl.load_bfcl(4, seed=7, wheel=wheel)
    assert a == bfcl.load_bfcl(4, seed=7, wheel=wheel)
    assert len(a) == 4 and len({e.id for e in a}) == 4
    assert [e.id for e in a] != [e.id for e in bfcl.load_bfcl(4, seed=8, wheel=wheel)]


def test_eligibility_of_multi_turn_base(wheel, entries):
    found, skipped = bfcl.eligible_bfcl(wheel=wheel)
    assert len(found) + len(skipped) == 200 and len(found) >= 190
    assert len(entries) == len(found)
    assert all(e.category == "multi_turn_base" and e.system for e in entries)


def test_tool_schemas_are_valid_json_schema(entries):
    unique = {}
    for entry in entries:
        names = [t["function"]["name"] for t in entry.tools]
        assert len(names) == len(set(names)), entry.id
        for tool in entry.tools:
            fn = tool["function"]
            assert tool["type"] == "function" and fn["description"]
            assert re.fullmatch(r"[a-zA-Z0-9_-]+", fn["name"]), fn["name"]
            unique[json.dumps(fn["parameters"], sort_keys=True)] = fn["parameters"]
    for schema in unique.values():  # the same classes recur across entries: check each once
        Draft202012Validator.check_schema(schema)
        assert schema["type"] == "object"


def test_replayed_calls_fit_their_tools(entries):
    n_calls = 0
    for entry in entries:
        validators = {t["function"]["name"]: Draft202012Validator(t["function"]["parameters"])
                      for t in entry.tools}
        assert entry.turns and all(t.user for t in entry.turns), entry.id
        for turn in entry.turns:
            assert all(len(cs) == len(ms) == 1 for cs, ms in turn.rounds)
        for call, msg in _calls(entry):
            n_calls += 1
            assert call["name"] in validators, (entry.id, call)
            validators[call["name"]].validate(call["arguments"])
            assert msg["role"] == "tool" and msg["name"] == call["name"]
            assert isinstance(msg["content"], str) and msg["content"], (entry.id, call)
    assert n_calls > 1000


def test_max_turns_and_batched_rounds(wheel):
    (one,) = bfcl.load_bfcl(1, seed=1, wheel=wheel)
    (batched,) = bfcl.load_bfcl(1, seed=1, wheel=wheel, max_turns=2, one_call_per_round=False)
    assert batched.id == one.id and len(batched.turns) == min(2, len(one.turns))
    for a, b in zip(one.turns, batched.turns):
        assert len(b.rounds) == (1 if a.rounds else 0)
        assert _calls(bfcl.BfclEntry(one.id, one.category, one.system, one.tools, [a])) == \
            _calls(bfcl.BfclEntry(one.id, one.category, one.system, one.tools, [b]))
