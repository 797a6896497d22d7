"""OpenAI-style messages for chat formatting: validation/normalisation, and the fallback tool
format (see chat_format.py's docstring) for templates without tool support."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agentrt.conversation.call_ids import call_id, scoped
from agentrt.errors import ChatTemplateError
from agentrt.toolcall.formats import HERMES
from agentrt.toolcall.tags import RESPONSE_CLOSE, RESPONSE_OPEN

ROLES = ("system", "user", "assistant", "tool")

TOOLS_INSTRUCTION = (
    "You can call the tools listed below. To call one, answer with a block of the form\n"
    f"{HERMES.block_begin}{HERMES.call_prefix('<tool name>')}{{<arguments as JSON>}}}}{HERMES.block_end}\n"
    f"(one block per call). Tool results come back inside {RESPONSE_OPEN}{RESPONSE_CLOSE}.\n"
)


def as_list(value: Any, what: str) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ChatTemplateError(f"{what} must be a list, got {type(value).__name__}")
    return list(value)


def _text(i: int, role: str, content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, Mapping) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ChatTemplateError(f"message {i} ({role}): content must be a string or a list of text parts")


def normalize(i: int, msg: Any) -> dict[str, Any]:
    """A validated plain-dict copy of one OpenAI-style message."""
    if not isinstance(msg, Mapping):
        raise ChatTemplateError(f"message {i} must be a dict, got {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise ChatTemplateError(f"message {i} has role {role!r}; use one of {', '.join(ROLES)}")
    out: dict[str, Any] = {"role": role, "content": _text(i, role, msg.get("content"))}
    calls = msg.get("tool_calls") if role == "assistant" else None
    if calls:
        out["tool_calls"] = [_normalize_call(i, n, c) for n, c in enumerate(as_list(calls, "tool_calls"))]
    if out["content"] is None and not calls:
        raise ChatTemplateError(f"message {i} ({role}) has no content")
    if role == "tool":
        if not isinstance(msg.get("tool_call_id"), str) or not msg["tool_call_id"]:
            raise ChatTemplateError(f"message {i} (tool) needs a tool_call_id naming the call it answers")
        out["tool_call_id"] = msg["tool_call_id"]
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
    return out


def _normalize_call(i: int, n: int, call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ChatTemplateError(f"message {i}: tool_calls[{n}] needs function.name (OpenAI format)")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # templates expect a dict; keep the string if it is not a JSON object
        try:
            parsed = json.loads(args)
            args = parsed if isinstance(parsed, dict) else args
        except json.JSONDecodeError:
            pass
    elif not isinstance(args, Mapping):
        raise ChatTemplateError(f"message {i}: tool_calls[{n}].function.arguments must be a str or dict")
    return {"id": str(call.get("id", call_id(scoped(i), n))), "type": "function",
            "function": {"name": fn["name"], "arguments": dict(args) if isinstance(args, Mapping) else args}}


def check_tool(tool: Any) -> Mapping[str, Any]:
    fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ChatTemplateError("each tool must be an OpenAI function tool: {'type': 'function', 'function': {'name': ...}}")
    return tool


def fallback(msgs: list[dict[str, Any]], tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rewrite tool-related messages as plain system/user/assistant turns (see module docstring)."""
    out = []
    for msg in msgs:
        if msg["role"] == "tool":
            out.append({"role": "user", "content": f"{RESPONSE_OPEN}\n{msg['content']}\n{RESPONSE_CLOSE}"})
        elif msg.get("tool_calls"):
            calls = HERMES.render_calls([(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]])
            out.append({"role": "assistant", "content": f"{msg['content']}\n{calls}" if msg["content"] else calls})
        else:
            out.append(dict(msg))
    if tools:
        block = TOOLS_INSTRUCTION + "<tools>\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + "\n</tools>"
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
