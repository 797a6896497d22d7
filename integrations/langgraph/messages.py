"""LangChain messages and tools <-> the OpenAI-style dicts agentrt's chat format takes.

Also the *fingerprint* of a message: what must be equal for two messages to render to the same
tokens. The session ledger (`sessions.py`) compares fingerprints to find how much of a resent
LangGraph history the KV session already holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import (AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage,
                                     ToolMessage)
from langchain_core.utils.function_calling import convert_to_openai_tool

from agentrt.errors import ConfigError
from agentrt.session.router import canonical_json

_ROLES = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
          "system": "system", "developer": "system", "tool": "tool"}


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
            elif isinstance(block, Mapping) and block.get("type") in ("tool_call", "tool_call_chunk"):
                continue  # carried by AIMessage.tool_calls
            else:
                raise ConfigError(f"content block {block!r} is not supported: agentrt models take text only")
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


def tools_to_openai(tools: Sequence[Any]) -> list[dict]:
    """LangChain tools, pydantic models, functions, TypedDicts or OpenAI tool dicts -> OpenAI
    tool schemas (`{"type": "function", "function": {name, description, parameters}}`)."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigError("bind_tools takes a list of tools")
    out = []
    for t in tools:
        try:
            spec = convert_to_openai_tool(t)
        except Exception as exc:  # LangChain raises ValueError / TypeError / ...
            raise ConfigError(f"cannot use {t!r} as a tool: {exc}") from exc
        spec["function"].setdefault("parameters", {"type": "object", "properties": {}})
        out.append(spec)
    names = [s["function"]["name"] for s in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"tool names must be unique, got {names}")
    return out


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
    import pydantic

    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        return schema.model_json_schema(), schema
    if isinstance(schema, Mapping) and "type" in schema and "function" not in schema and "title" not in schema:
        return dict(schema), None  # already a JSON schema
    try:
        return convert_to_openai_tool(schema)["function"]["parameters"], None
    except Exception as exc:
        raise ConfigError(f"cannot turn {schema!r} into a JSON schema: {exc}") from exc


__all__ = ["AIMessage", "HumanMessage", "SystemMessage", "ToolMessage", "canonical_json", "content_text",
           "fingerprint", "normalize_tool_choice", "structured_schema", "to_openai", "tools_to_openai"]
