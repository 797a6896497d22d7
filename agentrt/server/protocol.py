"""The OpenAI wire format the server accepts: request models, message conversion, errors.

Requests are validated here, before any engine work: a known field with a wrong type or range,
or a feature the server does not implement (n > 1, logprobs, image content, penalties), is an
`ApiError` that becomes an OpenAI-shaped error body (`{"error": {"message", "type", "param",
"code"}}`) with status 400, never a 500. Unknown fields are ignored, as OpenAI-compatible
servers do (clients send vendor extensions).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrt.errors import AgentrtError


class ApiError(AgentrtError):
    """An error answered to the client: HTTP status + OpenAI error type, param and code."""

    def __init__(self, message: str, status: int = 400, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = Field(default=None, validate_default=True)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    logprobs: bool | int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False  # vLLM's extension: the generated ids in each choice
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        stops = [v] if isinstance(v, str) else list(v or ())
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    def unsupported(self) -> None:
        """ApiError for what the server does not implement (rather than silently ignoring it)."""
        if self.n != 1:
            raise ApiError("n must be 1: one choice per request is supported", param="n")
        if self.logprobs:
            raise ApiError("logprobs are not supported", param="logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise ApiError(f"{name} is not supported; leave it at 0", param=name)
        if self.logit_bias:
            raise ApiError("logit_bias is not supported", param="logit_bias")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


class ChatRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=256)


class CompletionRequest(_Request):
    prompt: str | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.echo or self.suffix or (self.best_of or 1) != 1:
            raise ApiError("echo, suffix and best_of are not supported", param="prompt")


def parse(model: type[BaseModel], raw: bytes) -> Any:
    """The request body as `model`, or ApiError (400) saying which field is wrong."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ApiError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise ApiError(f"{param or 'body'}: {err['msg']}", param=param) from None
    req.unsupported()
    return req


# ---- messages -------------------------------------------------------------------------------

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def to_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI chat messages -> the conversation core's dicts: text content as one string, a
    developer message as a system one, tool results named after the call they answer."""
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(raw):
        role = m.get("role")
        if role not in _ROLES:
            raise ApiError(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {role!r}", param=f"messages.{i}.role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text(m.get("content"), i)}
        if role == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [_call(c, i) for c in m["tool_calls"]]
            names.update({c["id"]: c["function"]["name"] for c in msg["tool_calls"]})
        if role == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str):
                raise ApiError(f"messages[{i}]: a tool message needs its tool_call_id", param=f"messages.{i}.tool_call_id")
            msg["tool_call_id"] = cid
            name = m.get("name") or names.get(cid)
            if name:
                msg["name"] = name
        out.append(msg)
    return out


def _text(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, Mapping) or p.get("type") not in ("text", "input_text") or not isinstance(p.get("text"), str):
                kind = p.get("type") if isinstance(p, Mapping) else type(p).__name__
                raise ApiError(f"messages[{i}].content: only text parts are supported, got {kind!r}",
                               param=f"messages.{i}.content")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts", param=f"messages.{i}.content")


def _call(c: Any, i: int) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not isinstance(c.get("id"), str):
        raise ApiError(f"messages[{i}].tool_calls: each call needs an id and function.name", param=f"messages.{i}.tool_calls")
    args = fn.get("arguments", "{}")
    try:
        json.loads(args) if isinstance(args, str) else None
    except ValueError:
        raise ApiError(f"messages[{i}].tool_calls: arguments of {fn['name']!r} are not valid JSON",
                       param=f"messages.{i}.tool_calls") from None
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {"id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": args}}


def tools_of(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The request's function tools, checked (a name and an object schema each)."""
    if not req.tools:
        return None
    for i, t in enumerate(req.tools):
        fn = t.get("function")
        if t.get("type", "function") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ApiError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                           param=f"tools.{i}")
    return [{"type": "function", "function": dict(t["function"])} for t in req.tools]


def tool_choice_of(req: ChatRequest, tools: list[dict] | None) -> Any:
    """"auto" / "none" / "required" / a tool name (from OpenAI's `{"type": "function", ...}`)."""
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), Mapping) else None
        if name is None or not tools or name not in {t["function"]["name"] for t in tools}:
            raise ApiError(f"tool_choice {choice!r} names no tool of the request", param="tool_choice")
        return name
    if choice not in ("auto", "none", "required"):
        raise ApiError(f"tool_choice must be 'auto', 'none', 'required' or a named function, got {choice!r}",
                       param="tool_choice")
    if choice == "required" and not tools:
        raise ApiError("tool_choice 'required' needs tools", param="tool_choice")
    return choice


def json_schema_of(fmt: dict[str, Any] | None) -> Any:
    """response_format -> the JSON schema the output is decoded under (None: free text)."""
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "object"}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if isinstance(spec, Mapping) and isinstance(spec.get("schema", {}), Mapping):
            return dict(spec.get("schema") or {"type": "object"})
    raise ApiError("response_format must be {'type': 'text' | 'json_object'} or "
                   "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}", param="response_format")


Finish = Literal["stop", "length", "tool_calls"]
