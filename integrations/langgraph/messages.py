"""LangChain messages and tools <-> the OpenAI-style dicts agentrt's chat format takes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from agentrt.conversation.router import canonical_json
from agentrt.errors import ConfigError
from agentrt.tools.dispatch import Toolset
from agentrt.tools.tool import Tool

_ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
          "system": "system", "developer": "system", "tool": "tool"}


# content blocks whose information is carried elsewhere: tool calls (LangChain's `tool_call`,
# Anthropic's `tool_use`, OpenAI's `function_call`) live in AIMessage.tool_calls; reasoning blocks
# of earlier replies are dropped, as chat templates drop earlier <think> blocks
_CARRIED_ELSEWHERE = frozenset({"tool_call", "tool_call_chunk", "tool_use", "function_call", "server_tool_call",
                                "reasoning", "thinking", "redacted_thinking"})


def content_text(content: Any) -> str:
    """A message's text: a str as is; a list of content blocks -> their text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            elif isinstance(block, Mapping) and block.get("type") in _CARRIED_ELSEWHERE:
                continue  # calls are AIMessage.tool_calls; past reasoning is not re-rendered (as chat templates do)
            else:
                kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
                raise ConfigError(f"content block of type {kind!r} is not supported: agentrt models take text "
                                  "(blocks of type 'text'), with tool calls in AIMessage.tool_calls")
        return "".join(parts)
    raise ConfigError(f"message content must be a str or a list of text blocks, got {type(content).__name__}")


def to_openai(messages: Sequence[BaseMessage]) -> list[dict]:
    """LangChain messages -> chat-format dicts (roles system / user / assistant / tool)."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, BaseMessage):
            raise ConfigError(f"message {i} is a {type(m).__name__}, not a LangChain message")
        out.append(_one(m))
    return out


def _one(m: BaseMessage) -> dict:
    role = m.role if isinstance(m, ChatMessage) else m.type
    if role not in _ROLES:
        raise ConfigError(f"message role {role!r} is not supported; use system, human, ai or tool messages")
    d: dict[str, Any] = {"role": _ROLES[role], "content": content_text(m.content)}
    if isinstance(m, AIMessage) and m.tool_calls:
        d["tool_calls"] = [{"id": tc.get("id") or "", "type": "function",
                            "function": {"name": tc["name"], "arguments": canonical_json(tc["args"])}}
                           for tc in m.tool_calls]
    if isinstance(m, ToolMessage):
        d["tool_call_id"] = m.tool_call_id
        if m.name:
            d["name"] = m.name
    return d


def tools_to_openai(tools: Sequence[Any] | Toolset, strict: bool | None = None) -> list[dict]:
    """agentrt `Tool`s (or a `Toolset`), LangChain tools, pydantic models, functions,
    TypedDicts or OpenAI tool dicts -> OpenAI tool schemas (`{"type": "function", "function":
    {name, description, parameters}}`); a tool given twice (same name, same accepted arguments)
    is kept once."""
    if isinstance(tools, Toolset):
        tools = list(tools)
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigError("bind_tools takes a list of tools (or an agentrt Toolset)")
    out: dict[str, dict] = {}
    for t in tools:
        try:
            spec = _agentrt_schema(t, strict) if isinstance(t, Tool) else convert_to_openai_tool(t, strict=strict)
        except Exception as exc:  # LangChain raises ValueError / TypeError / ...
            raise ConfigError(f"cannot use {t!r} as a tool: {exc}") from exc
        spec["function"].setdefault("parameters", {"type": "object", "properties": {}})
        name = spec["function"]["name"]
        if name in out and _validating(out[name]["function"]["parameters"]) != \
                _validating(spec["function"]["parameters"]):
            raise ConfigError(f"two different tools are named {name!r}; tool names must be unique (the same tool "
                              "given twice, e.g. a pydantic class and its JSON schema, is bound once)")
        out.setdefault(name, spec)
    return list(out.values())


def _agentrt_schema(t: Tool, strict: bool | None) -> dict:
    """An agentrt Tool's own OpenAI schema (what `@tool` derived from its signature and
    docstring), with LangChain's `strict` flag where it is given."""
    spec = t.openai_schema()
    if strict is not None:
        spec["function"]["strict"] = strict
    return spec


# JSON-schema keywords that annotate without constraining, and those whose value maps names to schemas
_ANNOTATIONS = frozenset({"title", "description", "examples", "$comment", "default"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _validating(schema: Any, names: bool = False) -> Any:
    """A JSON schema without its annotations: two schemas equal here accept the same instances."""
    if isinstance(schema, Mapping):
        if names:
            return {k: _validating(v) for k, v in schema.items()}
        return {k: _validating(v, k in _SCHEMA_MAPS) for k, v in schema.items() if k not in _ANNOTATIONS}
    if isinstance(schema, list):
        return [_validating(v) for v in schema]
    return schema


def normalize_tool_choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> Any:
    """LangChain's tool_choice forms -> agentrt's: "any" / True -> "required"; a tool name or an
    OpenAI dict stays; None -> "auto"."""
    if tool_choice is None or tool_choice == "auto":
        return "auto"
    if tool_choice is True or tool_choice in ("any", "required"):
        return "required"
    if tool_choice is False or tool_choice == "none":
        return "none"
    names = {t["function"]["name"] for t in tools}
    name = tool_choice["function"]["name"] if isinstance(tool_choice, Mapping) and "function" in tool_choice \
        else tool_choice
    if not isinstance(name, str) or name not in names:
        raise ConfigError(f"tool_choice {tool_choice!r} names no bound tool; bound: {sorted(names)}")
    return name


def structured_schema(schema: Any) -> tuple[dict, Any]:
    """A with_structured_output schema -> (JSON schema, pydantic class or None)."""
    from pydantic import BaseModel
    from pydantic.v1 import BaseModel as BaseModelV1

    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema(), schema
    if isinstance(schema, type) and issubclass(schema, BaseModelV1):  # (a pydantic.v1 model)
        return schema.schema(), schema
    if isinstance(schema, Mapping) and "type" in schema and "function" not in schema and "title" not in schema:
        return dict(schema), None  # already a JSON schema
    try:
        return convert_to_openai_tool(schema)["function"]["parameters"], None
    except Exception as exc:
        raise ConfigError(f"cannot turn {schema!r} into a JSON schema: {exc}") from exc


__all__ = ["AIMessage", "HumanMessage", "SystemMessage", "ToolMessage", "canonical_json", "content_text",
           "normalize_tool_choice", "structured_schema", "to_openai", "tools_to_openai"]
