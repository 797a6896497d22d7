"""The parts of a chat request, as pydantic models of OpenAI's API: messages, tool calls, tools,
tool_choice and response_format. A body is checked against these before anything uses it, so a
wrong type, a missing field or a bad value is a 400 naming the field (`messages.1.tool_calls`),
never a TypeError deep in the conversion. Unknown fields are ignored, as OpenAI's API does.

A tool's `parameters` and a `json_schema` must be valid JSON Schema (the metaschema check); a
valid schema the grammar backend still cannot compile is caught when the grammar is built
(`SchemaUnsupported`, also a 400).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# OpenAI's rule for function and schema names
NAME = r"^[A-Za-z0-9_.\-]{1,64}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Model):
    type: Literal["text", "input_text"]
    text: str


class CallFunction(_Model):
    name: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Model):
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: CallFunction


class Message(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _by_role(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message holds tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs its tool_call_id")
        for c in self.tool_calls or ():
            if isinstance(c.function.arguments, str):
                try:
                    json.loads(c.function.arguments)
                except ValueError:
                    raise ValueError(f"the arguments of call {c.id!r} ({c.function.name}) are not valid JSON") from None
        return self

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class FunctionDef(_Model):
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_schema(v)


class ToolDef(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(_Model):
    name: str = Field(default="response", pattern=NAME)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_schema(v)


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs json_schema: {'name': ..., 'schema': {...}}")
        return self


def check_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """`schema`, or ValueError when it is not valid JSON Schema (2020-12 metaschema)."""
    if schema is None:
        return None
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise ValueError(f"not a valid JSON schema{f' at /{where}' if where else ''}: {e.message}") from None
    except RecursionError:
        raise ValueError("the schema is nested too deeply") from None
    return schema
