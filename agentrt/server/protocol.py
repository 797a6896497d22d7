"""What the wire protocols share: `ApiError`, `parse` (a body as a request model), and the
`ChatRequest` -- OpenAI's chat body, which every protocol's request is stated as for its round
(openai/chat.py takes it as is; responses/ and anthropic/ convert theirs) -- with its conversion
to the conversation core's messages, tools, tool_choice and JSON schema.

Requests are validated before any engine work, against pydantic models of the whole body
(the chat parts in chat_parts.py): a known field with a wrong type, range or nesting, or a feature
the server does not implement (n > 1, logprobs, image content, penalties), is an `ApiError` that
becomes an OpenAI-shaped error body (`{"error": {"message", "type", "param", "code"}}`) with
status 400 and `param` the field's path (`messages.1.tool_calls`), never a 500. Unknown fields
are ignored, as OpenAI-compatible servers do (clients send vendor extensions).
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentrt.errors import AgentrtError
from agentrt.sampling import SamplingParams

from .chat_parts import Message, NamedChoice, ResponseFormat, ToolCall, ToolDef


class ApiError(AgentrtError):
    """An error answered to the client: HTTP status + OpenAI error type, param and code."""

    def __init__(self, message: str, status: int = 400, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        """Anthropic's error shape: its error type follows from the status."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        where = f"{self.param}: " if self.param and not self.message.startswith(self.param) else ""
        return {"type": "error", "error": {"type": kind, "message": where + self.message}}


_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class RequestBody(BaseModel):
    """A wire protocol's request body (what `parse` reads): unknown fields are ignored, and
    `unsupported` refuses the known ones the server does not implement."""

    model_config = ConfigDict(extra="ignore")

    def unsupported(self) -> None:
        """ApiError for what the server does not implement (here: nothing)."""


class SamplingRequest(RequestBody):
    """The fields a chat and a completions request share: sampling, stop strings, streaming, the
    features refused (`unsupported`) and vLLM's extensions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)
    stop: list[str] = Field(default_factory=list)  # OpenAI's str | list[str] | null, as a list
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: bool | int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM's extensions: top_k (0 or -1: off), min_p, repetition_penalty
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False  # vLLM's extension: the generated ids in each choice
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever the model says
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: a prefix-cache namespace

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, v: object) -> object:
        return [v] if isinstance(v, str) else [] if v is None else v

    @field_validator("stop")
    @classmethod
    def _stop(cls, stops: list[str]) -> list[str]:
        if len(stops) > 4 or not all(stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    def unsupported(self) -> None:
        """ApiError for what the server does not implement (rather than silently ignoring it)."""
        if self.n != 1:
            raise ApiError("n must be 1: one choice per request is supported", param="n")
        if self.logprobs:
            raise ApiError("logprobs are not supported", param="logprobs")
        if self.logit_bias:
            raise ApiError("logit_bias is not supported", param="logit_bias")

    def sampling(self, max_tokens: int) -> SamplingParams:
        """The engine's SamplingParams for this body."""
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
                              top_k=max(self.top_k, 0), min_p=self.min_p, seed=self.seed, ignore_eos=self.ignore_eos,
                              presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                              repetition_penalty=self.repetition_penalty)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(SamplingRequest):
    """OpenAI's chat body: the request every wire protocol's round runs as (round_runner.py)."""

    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = Field(default=None, max_length=256)
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    prompt_cache_key: str | None = Field(default=None, min_length=1, max_length=256)


_Req = TypeVar("_Req", bound=RequestBody)


def parse(model: type[_Req], raw: bytes) -> _Req:
    """The request body as `model`, or ApiError (400) saying which field is wrong."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ApiError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError("the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError("the request body must be a JSON object")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        param, message = first_error(e)
        raise ApiError(f"{param or 'body'}: {message}", param=param) from None
    except RecursionError:
        raise ApiError("the request body is nested too deeply") from None
    req.unsupported()
    return req


def first_error(e: ValidationError) -> tuple[str | None, str]:
    """The field path of the first error (without pydantic's union-member tags) and its message;
    a union's errors at the same field are joined ("a valid string or a valid list")."""
    found: dict[tuple, list[str]] = {}
    for err in e.errors():
        path = tuple(str(p) for p in err["loc"] if isinstance(p, int) or p.isidentifier() and p not in _TAGS)
        msg = err["msg"].removeprefix("Value error, ")
        found.setdefault(path, []).append(msg[0].lower() + msg[1:] if msg else msg)
    deepest = max(found, key=len)  # (a union's member that got furthest says the most)
    return ".".join(deepest) or None, " or ".join(dict.fromkeys(found[deepest]))


_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "NamedChoice"}


# ---- conversion ---------------------------------------------------------------------------

def to_messages(raw: list[Message]) -> list[dict[str, Any]]:
    """Validated chat messages -> the conversation core's dicts: text content as one string, a
    developer message as a system one, tool results named after the call they answer."""
    names: dict[str, str] = {}
    out = []
    for m in raw:
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text}
        if m.tool_calls:
            msg["tool_calls"] = [_call(c) for c in m.tool_calls]
            names.update({c.id: c.function.name for c in m.tool_calls})
        if m.role == "tool" and m.tool_call_id is not None:  # (a tool message has one: Message checks)
            msg["tool_call_id"] = m.tool_call_id
            if name := m.name or names.get(m.tool_call_id):
                msg["name"] = name
        out.append(msg)
    return out


def _call(c: ToolCall) -> dict[str, Any]:
    args = c.function.arguments
    args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}}


def tools_of(req: ChatRequest) -> list[dict[str, Any]] | None:
    """The request's function tools (each name once)."""
    if not req.tools:
        return None
    seen: set[str] = set()
    for i, t in enumerate(req.tools):
        if t.function.name in seen:
            raise ApiError(f"tools.{i}: a second tool named {t.function.name!r}", param=f"tools.{i}.function.name")
        seen.add(t.function.name)
    return [{"type": "function", "function": t.function.model_dump(exclude_none=True)} for t in req.tools]


def tool_choice_of(req: ChatRequest, tools: list[dict] | None) -> Any:
    """"auto" / "none" / "required" / a tool name (from OpenAI's `{"type": "function", ...}`)."""
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    if isinstance(choice, NamedChoice):
        name = choice.function.name
        if not tools or name not in {t["function"]["name"] for t in tools}:
            raise ApiError(f"tool_choice names {name!r}, which is no tool of the request", param="tool_choice")
        return name
    if choice == "required" and not tools:
        raise ApiError("tool_choice 'required' needs tools", param="tool_choice")
    return choice


def json_schema_of(fmt: ResponseFormat | None) -> Any:
    """response_format -> the JSON schema the output is decoded under (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.json_schema is None:  # (json_schema has one: ResponseFormat checks)
        return {"type": "object"}
    return dict(fmt.json_schema.schema_ or {"type": "object"})


Finish = Literal["stop", "length", "tool_calls"]
