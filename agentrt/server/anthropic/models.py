"""Anthropic's Messages API wire format: the request model, its messages as chat messages, and
the message and stream events built from a finished round.

A request becomes a `ChatRequest` (system, messages, tools with their `input_schema`,
tool_choice, stop_sequences, max_tokens), so the same routed session, grammar and validator
serve it. Blocks: `text`; `tool_use` in assistant turns (a chat tool call, its `input` as the
arguments); `tool_result` in user turns (a tool message answering its `tool_use_id`, before the
turn's text); `thinking` blocks sent back are dropped. Images and documents are 400s.
Usage follows Anthropic's meaning: `input_tokens` are the prompt tokens computed, and
`cache_read_input_tokens` those served from KV already held.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentrt.conversation.conversation import RoundEnd

from ..chat_parts import NAME
from ..protocol import ApiError, ChatRequest, RequestBody, first_error, parse


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Block(_Model):
    type: Literal["text", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = Field(default=None, min_length=1, max_length=256)
    content: str | list["Block"] | None = None
    is_error: bool = False

    @model_validator(mode="after")
    def _fields(self) -> "Block":
        need = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}.get(self.type, ())
        if missing := [f for f in need if getattr(self, f) is None]:
            raise ValueError(f"a {self.type} block needs {', '.join(missing)}")
        return self


class Message(_Model):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Model):
    name: str = Field(pattern=NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class SystemBlock(_Model):
    type: Literal["text"]
    text: str


class MessagesRequest(RequestBody):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = Field(default=None, max_length=256)
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=4)
    temperature: float = Field(default=1.0, ge=0.0, le=1.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None

    def unsupported(self) -> None:
        if self.top_k is not None:
            raise ApiError("top_k is not supported; leave it out", param="top_k")

    @property
    def user(self) -> str | None:
        uid = (self.metadata or {}).get("user_id")
        return uid if isinstance(uid, str) and uid else None


class CountRequest(RequestBody):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None


def parse_messages(raw: bytes) -> MessagesRequest:
    return parse(MessagesRequest, raw)


def parse_count(raw: bytes) -> CountRequest:
    return parse(CountRequest, raw)


def chat_messages(req: MessagesRequest | CountRequest) -> list[dict[str, Any]]:
    """System + messages as chat messages (OpenAI chat shape, for ChatRequest)."""
    out: list[dict[str, Any]] = []
    if req.system:
        text = req.system if isinstance(req.system, str) else "\n\n".join(b.text for b in req.system)
        out.append({"role": "system", "content": text})
    for m in req.messages:
        blocks = [Block(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        text = "".join(b.text for b in blocks if b.type == "text" and b.text is not None)  # (Block checks it)
        if m.role == "assistant":
            calls = [{"id": b.id, "type": "function", "function": {
                "name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}} for b in blocks if b.type == "tool_use"]
            out.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
            continue
        for b in blocks:
            if b.type == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": _result_text(b)})
        if text or not any(b.type == "tool_result" for b in blocks):
            out.append({"role": "user", "content": text})
    return out


def _result_text(b: Block) -> str:
    text = b.content if isinstance(b.content, str) else "".join(x.text or "" for x in b.content or ())
    return f"Error: {text}" if b.is_error else text


def chat_request(req: MessagesRequest) -> ChatRequest:
    body: dict[str, Any] = {"messages": chat_messages(req), "max_tokens": req.max_tokens,
                            "temperature": req.temperature, "top_p": req.top_p, "user": req.user,
                            "stop": req.stop_sequences or None}
    if req.tools:
        body["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                           "parameters": t.input_schema}} for t in req.tools]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type) or \
            {"type": "function", "function": {"name": choice.name}}
        body["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    try:
        return ChatRequest.model_validate(body)
    except ValidationError as e:  # named as the Messages request names it
        path, message = first_error(e)
        param = (path or "messages").replace(".function", "", 1).replace("parameters", "input_schema")
        raise ApiError(f"{param}: {message}", param=param) from None


def stop_reason(end: RoundEnd, stops: list[str] | None, decoded: str) -> tuple[str, str | None]:
    """Anthropic's stop_reason (and the stop sequence that ended the turn, if one did)."""
    if end.calls:
        return "tool_use", None
    if end.finish_reason == "length":
        return "max_tokens", None
    text = end.message.get("content") or ""
    for s in stops or ():
        if text + s in decoded:
            return "stop_sequence", s
    return "end_turn", None


def usage(end: RoundEnd) -> dict:
    u = end.usage
    if u is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "cache_read_input_tokens": u.cached_tokens,
            "cache_creation_input_tokens": 0, "output_tokens": u.completion_tokens}


def content(end: RoundEnd) -> list[dict]:
    out = [{"type": "text", "text": end.message["content"]}] if end.message.get("content") else []
    for c in end.message.get("tool_calls") or ():
        out.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"])})
    return out
