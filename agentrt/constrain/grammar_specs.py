"""What a grammar is built from (constrain/grammar.py::GrammarFactory compiles it): the
`tool_choice` mode, the tool set's cache key, and the GrammarSpec of tool calls or of a JSON
schema, each argument checked (ConfigError naming what to pass)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from agentrt.constrain.grammar_backends import CallSpec, GrammarSpec, schema_json
from agentrt.errors import ConfigError
from agentrt.toolcall.formats import ToolFormat
from agentrt.toolcall.specs import ToolSpec, load_tool_specs

_REQUIRED = ("required", "any")


def choice_mode(tool_choice: object) -> tuple[str, str | None]:
    """(mode, tool name): mode in none / auto / required / named."""
    if tool_choice is None or tool_choice == "auto":
        return "auto", None
    if tool_choice == "none":
        return "none", None
    if tool_choice in _REQUIRED:
        return "required", None
    if isinstance(tool_choice, str) and tool_choice:
        return "named", tool_choice
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        if tool_choice.get("type") == "function" and isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            return "named", fn["name"]
    raise ConfigError("tool_choice must be 'none', 'auto', 'required', a tool name, or "
                      f"{{'type': 'function', 'function': {{'name': ...}}}}; got {tool_choice!r}")


def tools_key(tools: object) -> str:
    if isinstance(tools, Mapping) and all(isinstance(v, ToolSpec) for v in tools.values()):
        tools = {name: spec.parameters for name, spec in tools.items()}
    return schema_json(tools)


def calls_spec(tools: object, mode: str, name: str | None, parallel: bool, fmt: ToolFormat,
                answer: str = "") -> GrammarSpec:
    specs = load_tool_specs(tools)
    if name is not None and name not in specs:
        raise ConfigError(f"tool_choice names {name!r}, which is not among the tools: {', '.join(specs)}")
    chosen = [specs[name]] if name is not None else list(specs.values())
    calls = tuple(CallSpec(s.name, schema_json(s.parameters)) for s in chosen)
    return GrammarSpec("calls", calls, free_text=mode == "auto" and not answer, parallel=parallel, format=fmt,
                       answer_json=answer)


def json_spec(schema: Mapping[str, Any] | bool, text: str) -> GrammarSpec:
    if isinstance(schema, Mapping):
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except SchemaError as exc:
            raise ConfigError(f"invalid JSON schema: {exc.message}") from None
    return GrammarSpec("json", schema_json=text)
