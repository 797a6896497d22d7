"""What a model reads before a reply held to a JSON schema: the schema's fields, in order, with
their types and descriptions (issue 33: a grammar alone forces `{"setup": "` but never tells the
model that a `punchline` follows, so a small model fills `setup` until max_tokens).

`schema_hint(schema)` is the text; `Conversation.round` renders it just before the generation
prompt, through the model's chat template (`hinted_prompt`: a system message where the template
takes one there, else a user message, else appended to the last user message), for that round
only: the next round's prompt does not hold it, so the session's KV drops it (and recomputes the
reply after it).
"""

from __future__ import annotations

import json
from typing import Any

from agentrt.errors import ChatTemplateError

_MAX_ENUM = 8  # enum values listed at most


def schema_hint(schema: Any, with_tools: bool = False) -> str | None:
    """The hint for a reply held to `schema` (a JSON Schema dict), or None for JSON mode (no
    schema to show: {}, True, a bare {"type": "object"}): the caller's own prompt says what it
    wants there, and a generic "reply with JSON" only pulled the 135M model off it). `with_tools`:
    the model may call a tool instead, and the hint says so."""
    if not isinstance(schema, dict) or not set(schema) - {"type", "title", "description", "additionalProperties"}:
        return None
    props = schema.get("properties")
    lead = "When you answer instead of calling a tool, reply" if with_tools else "Reply"
    if schema.get("type", "object") != "object" or not isinstance(props, dict) or not props:
        return f"{lead} with only JSON that matches this schema, no other text:\n" + \
            json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    required = set(schema.get("required") or ())
    head = f"{lead} with only a JSON object, no other text"
    title = schema.get("title") or schema.get("description")
    head += f" ({title})" if isinstance(title, str) and title else ""
    lines = [head + ". Its fields, in this order:"]
    for name, sub in props.items():
        lines.append(f"- {json.dumps(name, ensure_ascii=False)} " + _field(sub, name in required, schema))
    return "\n".join(lines)


def hinted_prompt(conv, schema: Any, max_tokens: int, with_tools: bool = False) -> list[int] | None:
    """`conv`'s prompt (a Conversation with its assistant turn open) with the schema's hint
    before the generation prompt: a system message; else a user message; else (and first for
    Gemma's convention) the last user message with the hint after its text. None for
    JSON mode, or where none renders or the hint would not fit the context."""
    hint = schema_hint(schema, with_tools)
    if hint is None:
        return None
    n = len(conv.messages)
    for messages in _placements(conv.messages, hint, conv.chat.tool_convention == "gemma"):
        same = n if len(messages) > n else n - 1  # (messages before this index are unchanged)
        try:
            kept, ids, _ = conv.chat.extend(messages, tuple(k for k in conv.ends if k <= same), conv.tools,
                                            add_generation_prompt=True)
        except ChatTemplateError:
            continue
        prompt = conv.tokens[:conv.ends[kept]] + ids
        return prompt if len(prompt) + max_tokens <= conv.engine.max_context_tokens else None
    return None


def _placements(messages: list[dict], hint: str, user_turn_first: bool):
    """The hint's places to try, in order (Gemma's template has no system turn past the first:
    its own convention puts instructions in the user turn, so that goes first there)."""
    last = messages[-1] if messages else None
    merged = [*messages[:-1], {**last, "content": last["content"] + "\n\n" + hint}] \
        if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str) else None
    if user_turn_first and merged is not None:
        yield merged
    yield [*messages, {"role": "system", "content": hint}]
    yield [*messages, {"role": "user", "content": hint}]
    if merged is not None:
        yield merged


def _field(sub: Any, required: bool, root: dict) -> str:
    sub = _resolve(sub, root)
    kind = _kind(sub, root)
    note = kind if required else f"{kind}, optional"
    text = f"({note})"
    desc = sub.get("description") if isinstance(sub, dict) else None
    if isinstance(desc, str) and desc.strip():
        text += ": " + " ".join(desc.split())
    return text


def _resolve(sub: Any, root: dict) -> Any:
    """A local `$ref` (#/$defs/X, #/definitions/X) replaced by what it names."""
    ref = sub.get("$ref") if isinstance(sub, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return {**node, **{k: v for k, v in sub.items() if k != "$ref"}}
    return sub


def _kind(sub: Any, root: dict) -> str:
    """A short type name: string, integer, one of ["a", "b"], array of string, ..."""
    if not isinstance(sub, dict):
        return "any"
    if isinstance(sub.get("enum"), list):
        values = sub["enum"][:_MAX_ENUM]
        return "one of " + ", ".join(json.dumps(v, ensure_ascii=False) for v in values)
    if "const" in sub:
        return "exactly " + json.dumps(sub["const"], ensure_ascii=False)
    for key in ("anyOf", "oneOf"):
        if isinstance(sub.get(key), list):
            kinds = [_kind(_resolve(s, root), root) for s in sub[key]]
            return " or ".join(dict.fromkeys(k for k in kinds if k != "null")) + \
                (" or null" if "null" in kinds else "")
    t = sub.get("type")
    if isinstance(t, list):
        return " or ".join(str(x) for x in t)
    if t == "array":
        return "array of " + _kind(_resolve(sub.get("items"), root), root)
    if t == "object" and isinstance(sub.get("properties"), dict):
        return "object with " + ", ".join(json.dumps(k, ensure_ascii=False) for k in sub["properties"])
    return str(t) if t else "any"
