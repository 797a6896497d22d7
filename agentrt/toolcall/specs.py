"""Declared tools: normalising the caller's tool definitions and precompiling their validators.

Accepted forms of `tools`:
  * a mapping  name -> JSON schema of the parameters object;
  * a sequence of OpenAI function tools  {"type": "function", "function": {"name": ...,
    "description": ..., "parameters": {...}}}  (the unwrapped {"name", "parameters", ...}
    dict is accepted too). A missing "parameters" means a tool without parameters.

Every schema is checked with its jsonschema validator class (chosen by "$schema", default
Draft 2020-12) and compiled once; a bad definition raises ConfigError naming the tool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, best_match
from referencing.exceptions import Unresolvable

from agentrt.errors import ConfigError

_NO_PARAMETERS = MappingProxyType({"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolSpec:
    """One declared tool; `validator` is compiled once from `parameters`."""

    name: str
    parameters: Mapping[str, Any]
    description: str
    validator: Any  # a jsonschema Validator instance

    def schema_error(self, arguments: dict[str, Any]) -> str | None:
        """None when `arguments` satisfy the schema, else a message with the JSON path.

        A "$ref" that cannot be resolved only shows when validation reaches it; that is a bad
        tool definition, so it raises ConfigError rather than blaming the model's call.
        """
        try:
            error = best_match(self.validator.iter_errors(arguments))
        except Unresolvable as exc:
            raise ConfigError(f"the schema of tool {self.name!r} has an unresolvable $ref: {exc}") from None
        if error is None:
            return None
        return f"arguments of {self.name!r} violate the schema at {error.json_path}: {error.message}"


def load_tool_specs(tools: object) -> Mapping[str, ToolSpec]:
    """Validate and normalise `tools` (see the module docstring) into name -> ToolSpec.

    Idempotent: a mapping of ToolSpec (this function's result) is returned as is, so callers
    that create a parser per request can compile the schemas once and pass the result.
    """
    if isinstance(tools, Mapping) and tools and all(isinstance(v, ToolSpec) for v in tools.values()):
        for name, spec in tools.items():
            if name != spec.name:
                raise ConfigError(f"ToolSpec {spec.name!r} is filed under another name, {name!r}")
        return tools if isinstance(tools, MappingProxyType) else MappingProxyType(dict(tools))
    if isinstance(tools, Mapping):
        entries = [_from_mapping_item(name, schema) for name, schema in tools.items()]
    elif isinstance(tools, Sequence) and not isinstance(tools, (str, bytes)):
        entries = [_from_openai(i, tool) for i, tool in enumerate(tools)]
    else:
        raise ConfigError(
            "tools must be a mapping of name -> parameters JSON schema or a list of OpenAI "
            f"function tools, got {type(tools).__name__}"
        )
    if not entries:
        raise ConfigError("tools is empty: declare at least one tool")
    specs: dict[str, ToolSpec] = {}
    for name, description, parameters in entries:
        if name in specs:
            raise ConfigError(f"tool {name!r} is declared twice")
        specs[name] = _compile(name, description, parameters)
    return MappingProxyType(specs)


def _from_mapping_item(name: object, schema: object) -> tuple[str, str, object]:
    return _check_name(name, "tools mapping key"), "", schema


def _from_openai(position: int, tool: object) -> tuple[str, str, object]:
    where = f"tools[{position}]"
    if not isinstance(tool, Mapping):
        raise ConfigError(f"{where} must be a dict, got {type(tool).__name__}")
    if "function" in tool or "type" in tool:
        if tool.get("type") != "function":
            raise ConfigError(f"{where}['type'] must be 'function', got {tool.get('type')!r}")
        function = tool.get("function")
        where += "['function']"
        if not isinstance(function, Mapping):
            raise ConfigError(f"{where} must be a dict with 'name' and 'parameters'")
    else:
        function = tool
    name = _check_name(function.get("name"), f"{where}['name']")
    description = function.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}['description'] of tool {name!r} must be a string")
    return name, description, function.get("parameters", _NO_PARAMETERS)


def _check_name(name: object, where: str) -> str:
    """name, checked to be a non-empty string."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} must be a non-empty string, got {name!r}")
    return name


def _compile(name: str, description: str, parameters: object) -> ToolSpec:
    if not isinstance(parameters, Mapping):
        raise ConfigError(
            f"parameters of tool {name!r} must be a JSON schema object (dict), "
            f"got {type(parameters).__name__}"
        )
    parameters = dict(parameters)
    try:
        cls = jsonschema.validators.validator_for(parameters, default=jsonschema.Draft202012Validator)
        cls.check_schema(parameters)
    except SchemaError as exc:
        raise ConfigError(f"parameters of tool {name!r} is not a valid JSON schema: {exc.message}") from None
    except TypeError as exc:  # e.g. an unhashable "$schema"
        raise ConfigError(f"parameters of tool {name!r} is not a valid JSON schema: {exc}") from None
    declared = parameters.get("type", "object")
    if declared != "object" and not (isinstance(declared, list) and "object" in declared):
        raise ConfigError(
            f"parameters of tool {name!r} must describe an object (arguments are a JSON "
            f"object), but its schema has type {declared!r}"
        )
    return ToolSpec(name=name, parameters=MappingProxyType(parameters), description=description,
                    validator=cls(parameters))
