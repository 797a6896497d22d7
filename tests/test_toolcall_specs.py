"""Tool definitions and parser options are validated with clear ConfigErrors."""

from __future__ import annotations

import pytest

from agentrt.errors import ConfigError
from agentrt.toolcall import CallComplete, ToolCallParser, load_tool_specs
from tests.toolcall_harness import SPECS, TOOLS, W, tag

WEATHER = TOOLS["get_weather"]


def openai(name, parameters=WEATHER, **extra):
    function = {"name": name, "description": "d", "parameters": parameters, **extra}
    return {"type": "function", "function": function}


def test_openai_list_form_and_bare_function_dicts_are_accepted():
    specs = load_tool_specs([openai("get_weather"), {"name": "get_time"}])
    assert set(specs) == {"get_weather", "get_time"} and specs["get_weather"].description == "d"
    assert specs["get_time"].parameters["type"] == "object"  # no parameters: an empty object
    parser = ToolCallParser([openai("get_weather")], wrapper="hermes")
    events = parser.feed(tag(W)) + parser.close()
    assert isinstance(events[-1], CallComplete)


def test_compiled_specs_are_reused_as_is():
    assert load_tool_specs(SPECS) is SPECS
    assert ToolCallParser(SPECS).tools is SPECS


@pytest.mark.parametrize("tools,fragment", [
    (None, "tools must be a mapping"),
    ("get_weather", "tools must be a mapping"),
    ({}, "tools is empty"),
    ([], "tools is empty"),
    ({"": WEATHER}, "non-empty string"),
    ({1: WEATHER}, "non-empty string"),
    ({"t": "not a schema"}, "must be a JSON schema object"),
    ({"t": {"type": "objekt"}}, "not a valid JSON schema"),
    ({"t": {"type": "object", "properties": {"a": {"type": 5}}}}, "not a valid JSON schema"),
    ({"t": {"type": "string"}}, "must describe an object"),
    ({"t": {"type": "object", "required": "a"}}, "not a valid JSON schema"),
    ([openai("a"), openai("a")], "declared twice"),
    (["nope"], "tools[0] must be a dict"),
    ([{"type": "retrieval"}], "'type'] must be 'function'"),
    ([{"type": "function"}], "must be a dict with 'name' and 'parameters'"),
    ([{"type": "function", "function": {"parameters": WEATHER}}], "['name'] must be a non-empty string"),
    ([openai("a", description=3)], "['description'] of tool 'a' must be a string"),
    ([openai("a", parameters=[1])], "parameters of tool 'a' must be a JSON schema object"),
    ({"t": {"$schema": ["x"], "type": "object"}}, "not a valid JSON schema"),
])
def test_bad_tool_definitions_raise_config_error(tools, fragment):
    with pytest.raises(ConfigError) as info:
        ToolCallParser(tools)
    assert fragment in str(info.value)


@pytest.mark.parametrize("options,fragment", [
    ({"wrapper": "xml"}, "wrapper must be one of"),
    ({"parallel_calls": "yes"}, "parallel_calls must be a bool"),
    ({"stop_on_invalid": 1}, "stop_on_invalid must be a bool"),
    ({"max_calls": 0}, "max_calls must be None or an int >= 1"),
    ({"max_calls": True}, "max_calls must be None or an int >= 1"),
    ({"max_calls": 2.0}, "max_calls must be None or an int >= 1"),
    ({"parallel_calls": False, "max_calls": 3}, "needs parallel_calls=True"),
])
def test_bad_options_raise_config_error(options, fragment):
    with pytest.raises(ConfigError, match=".*") as info:
        ToolCallParser(SPECS, **options)
    assert fragment in str(info.value)


def test_misuse_of_feed_raises_config_error():
    parser = ToolCallParser(SPECS)
    with pytest.raises(ConfigError, match="takes str"):
        parser.feed(b"bytes")
    parser.close()
    with pytest.raises(ConfigError, match="after close"):
        parser.feed("x")


def test_schema_dialect_is_taken_from_dollar_schema():
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "maximum": 3, "exclusiveMaximum": True}}}
    spec = load_tool_specs({"t": draft4})["t"]
    assert spec.schema_error({"n": 2}) is None
    assert "$.n" in spec.schema_error({"n": 3})


def test_unresolvable_ref_is_reported_as_a_config_error_not_a_model_error():
    tools = {"t": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}
    parser = ToolCallParser(tools, wrapper="hermes")
    with pytest.raises(ConfigError, match="unresolvable"):
        parser.feed(tag('{"name": "t", "arguments": {"a": 1}}'))
