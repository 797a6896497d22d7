"""OpenAI's Responses API wire format: the request model, its input items as chat messages, and
the response object and output items built from a finished round.

A request is turned into a `ChatRequest` (messages, function tools, tool_choice, the `text.format`
schema as response_format, max_output_tokens) so that one code path -- `chat.prepare` /
`chat.run`, the routed KV session, the grammar -- serves both APIs. Input items: messages (text
parts), `function_call` (merged into the assistant message before it, as chat's tool_calls) and
`function_call_output` (a tool message); `reasoning` items a client sends back are dropped (the
session holds what the model thought). Other item and tool types (images, built-in tools) are 400s.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..chat_parts import NAME
from ..protocol import ApiError, ChatRequest, RequestBody, first_error, parse


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class InputPart(_Model):
    type: Literal["input_text", "output_text", "text", "refusal", "reasoning_text"]
    text: str | None = None
    refusal: str | None = None


class InputItem(_Model):
    type: Literal["message", "function_call", "function_call_output", "reasoning"] = "message"
    role: Literal["user", "system", "developer", "assistant"] | None = None
    content: str | list[InputPart] | None = None
    call_id: str | None = Field(default=None, min_length=1, max_length=256)
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None

    @model_validator(mode="after")
    def _fields(self) -> "InputItem":
        need = {"message": ("role",), "function_call": ("call_id", "name", "arguments"),
                "function_call_output": ("call_id", "output")}.get(self.type, ())
        if missing := [f for f in need if getattr(self, f) is None]:
            raise ValueError(f"a {self.type} item needs {', '.join(missing)}")
        return self


class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedTool(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    name: str = Field(default="response", pattern=NAME)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(_Model):
    format: TextFormat | None = None


class ResponsesRequest(RequestBody):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = Field(default=None, max_length=256)
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=256)
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=256)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)  # (vLLM's extension)

    def format_json(self) -> dict | None:
        fmt = self.text.format if self.text is not None else None
        return None if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)


def parse_request(raw: bytes) -> ResponsesRequest:
    return parse(ResponsesRequest, raw)


def input_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as chat messages (OpenAI chat shape, for ChatRequest)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        if item.type == "message":
            out.append({"role": item.role, "content": _text(item.content, f"input.{i}.content")})
        elif item.type == "function_call":
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.type == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"input.{i}.output")})
    return out


def _text(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for p in content:
        if p.type == "refusal":
            parts.append(p.refusal or "")
        elif p.text is None:
            raise ApiError(f"{param}: a {p.type} part needs its text", param=param)
        else:
            parts.append(p.text)
    return "".join(parts)


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatRequest, list[dict]]:
    """The ChatRequest that runs `req` after `history` (the chain so far, without instructions),
    and the chain's messages after this input (what a continuation resends)."""
    chain = [*history, *input_messages(req)]
    if not chain:
        raise ApiError("input is empty: give a message or a function_call_output", param="input")
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + chain
    body: dict[str, Any] = {
        "messages": messages, "parallel_tool_calls": req.parallel_tool_calls, "temperature": req.temperature,
        "top_p": req.top_p, "seed": req.seed, "user": req.user, "cache_salt": req.cache_salt}
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                         for t in req.tools]
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice if isinstance(req.tool_choice, str) else \
            {"type": "function", "function": {"name": req.tool_choice.name}}
    if (fmt := req.format_json()) is not None:
        body["response_format"] = fmt if fmt["type"] != "json_schema" else {
            "type": "json_schema", "json_schema": {"name": fmt["name"], "schema": fmt.get("schema") or {"type": "object"}}}
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    try:
        return ChatRequest.model_validate(body), chain
    except ValidationError as e:  # named as the Responses request names it
        path, message = first_error(e)
        param = _RENAMES.get((path or "").split(".")[0], "input")
        if path and path.startswith("tools."):
            param = path.replace(".function", "", 1)
        raise ApiError(f"{param}: {message}", param=param) from None


_RENAMES = {"response_format": "text.format", "max_tokens": "max_output_tokens", "tool_choice": "tool_choice"}
