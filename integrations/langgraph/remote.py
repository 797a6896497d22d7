"""ChatAgentrt against a remote `agentrt serve`: the same call (a `CallSpec`) as a streamed
`/v1/chat/completions` request, its chunks turned into the LangChain chunks the in-process path
yields (stream.py), so tools, structured output, streaming and usage behave alike.

The call's session key (its LangGraph thread and node) is the request's `prompt_cache_key`, so
the server keeps one KV session per thread and node and prefills only new messages;
`usage_metadata.input_token_details.cache_read` is the server's `cached_tokens`. Calls the
server's validator rejected come back under `agentrt.invalid_tool_calls` and become LangChain
`invalid_tool_calls`, as in-process. HTTP errors become agentrt's typed errors: 4xx ConfigError
(the server's message), 429 and 503 PoolExhausted (retried `max_retries` times before the first
chunk), an unreachable server EngineClosed, the call's timeout GenerationTimeout.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from agentrt.errors import AgentrtError, ConfigError, EngineClosed, GenerationTimeout, PoolExhausted

from .stream import _REJECTED, CallSpec, usage_metadata


class RemoteServer:
    """The HTTP side of a remote ChatAgentrt: `base_url` (ending in /v1) and its bearer key."""

    def __init__(self, base_url: str, api_key: str | None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"base_url must be the server's http(s) URL ending in /v1, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def body(self, spec: CallSpec) -> dict[str, Any]:
        p = spec.params
        body: dict[str, Any] = {
            "messages": spec.messages, "max_tokens": p.max_tokens,
            "temperature": p.temperature, "top_p": p.top_p, "stream": True, "stream_options": {"include_usage": True}}
        if spec.adapter is not None:  # (vLLM's convention: an adapter is served as a model of its own)
            body["model"] = spec.adapter
        elif spec.model_named:  # (else whatever the server serves answers: it 404s a name it does not serve)
            body["model"] = spec.model_name
        if p.seed is not None:
            body["seed"] = p.seed
        if spec.stop:
            body["stop"] = list(spec.stop)
        if spec.tools:
            choice = spec.tool_choice
            body.update(tools=spec.tools, parallel_tool_calls=spec.parallel_tool_calls,
                        tool_choice=choice if choice in ("auto", "none", "required")
                        else {"type": "function", "function": {"name": choice}})
        if spec.json_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response",
                                                                              "schema": spec.json_schema}}
        if spec.key is not None:
            body["prompt_cache_key"] = spec.key
        return body

    def request(self, spec: CallSpec) -> dict[str, Any]:
        """The arguments of `client.stream(...)` for a call."""
        return {"method": "POST", "url": f"{self.base_url}/chat/completions", "json": self.body(spec),
                "headers": self.headers}

    async def astream(self, spec: CallSpec) -> AsyncIterator[ChatGenerationChunk]:
        for attempt in range(spec.retries + 1):
            sent = False
            try:
                with self._errors(spec):
                    async with httpx.AsyncClient(timeout=_timeout(spec)) as client, \
                            client.stream(**self.request(spec)) as r:
                        if r.status_code != 200:
                            raise _error(r.status_code, await r.aread())
                        chunks = Chunks(spec)
                        async for line in r.aiter_lines():
                            for c in chunks.line(line):
                                sent = True
                                yield c
                return
            except PoolExhausted:  # (429 / 503) tried again until a chunk has gone out
                if sent or attempt == spec.retries:
                    raise

    def stream(self, spec: CallSpec) -> Iterator[ChatGenerationChunk]:
        """astream() for sync callers (the same request, errors and retries)."""
        for attempt in range(spec.retries + 1):
            sent = False
            try:
                with self._errors(spec), httpx.Client(timeout=_timeout(spec)) as client, \
                        client.stream(**self.request(spec)) as r:
                    if r.status_code != 200:
                        raise _error(r.status_code, r.read())
                    chunks = Chunks(spec)
                    for line in r.iter_lines():
                        for c in chunks.line(line):
                            sent = True
                            yield c
                return
            except PoolExhausted:
                if sent or attempt == spec.retries:
                    raise

    @contextlib.contextmanager
    def _errors(self, spec: CallSpec) -> Iterator[None]:
        """httpx's timeout and transport errors as agentrt's typed errors."""
        try:
            yield
        except httpx.TimeoutException:
            raise GenerationTimeout(f"the call to {self.base_url} ran past its timeout of {spec.timeout} s") from None
        except httpx.TransportError as e:
            raise EngineClosed(f"cannot reach agentrt serve at {self.base_url}: {e}") from None


def _timeout(spec: CallSpec) -> httpx.Timeout:
    return httpx.Timeout(spec.timeout if spec.timeout is not None else 600.0, connect=10.0)


def _error(status: int, raw: bytes) -> AgentrtError:
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = raw[:200].decode(errors="replace")
    if status in (429, 503):
        return PoolExhausted(f"agentrt serve is at capacity ({status}): {message}")
    if 400 <= status < 500:
        return ConfigError(f"agentrt serve refused the call ({status}): {message}")
    return AgentrtError(f"agentrt serve failed ({status}): {message}")


class Chunks:
    """The server's `chat.completion.chunk` events -> LangChain chunks: text as it streams; the
    calls' fragments gathered and emitted once the round ends, each call as one chunk (as the
    in-process path does at each verdict), so a call the server's validator rejected mid-stream
    (`agentrt.invalid_tool_calls`, by index) is never a partial entry of `tool_calls`."""

    def __init__(self, spec: CallSpec) -> None:
        self.spec = spec
        self.finish: str | None = None
        self.meta: dict[str, Any] = {"model_name": spec.model_name}
        self.calls: dict[int, dict] = {}  # index -> {"id", "name", "args"}

    def line(self, line: str) -> list[ChatGenerationChunk]:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return []
        data = json.loads(line[6:])
        out = []
        for choice in data.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out.append(ChatGenerationChunk(message=AIMessageChunk(content=delta["content"])))
            for tc in delta.get("tool_calls") or ():
                fn = tc.get("function") or {}
                call = self.calls.setdefault(tc["index"], {"id": tc.get("id"), "name": fn.get("name"), "args": ""})
                call["args"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                out += self._calls(data.get("agentrt") or {})
        if data.get("usage") is not None:
            out.append(self._last(data["usage"]))
        return out

    def _calls(self, extras: dict) -> list[ChatGenerationChunk]:
        if session := extras.get("session"):
            self.meta["agentrt_session"] = session
        rejected = {c.get("index"): c for c in extras.get("invalid_tool_calls") or ()}
        pieces = []
        for i, call in sorted(self.calls.items()):
            if i not in rejected:
                pieces.append(tool_call_chunk(name=call["name"], args=call["args"] or "{}", id=call["id"], index=i))
        for i, c in rejected.items():
            args = f"{_REJECTED}{json.dumps(c.get('reason'))}) {c.get('raw') or ''}"
            pieces.append(tool_call_chunk(name=c.get("name"), args=args, id=(self.calls.get(i) or {}).get("id"),
                                          index=i))
        return [ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[p])) for p in pieces]

    def _last(self, u: dict) -> ChatGenerationChunk:
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        usage_md = usage_metadata(u["prompt_tokens"], u["completion_tokens"], cached)
        if (computed := (u.get("agentrt") or {}).get("computed_prompt_tokens")) is not None:
            self.meta["computed_prompt_tokens"] = computed
        meta = {**self.meta, "finish_reason": self.finish or "stop"}
        msg = AIMessageChunk(content="", usage_metadata=usage_md, response_metadata=meta, chunk_position="last")
        return ChatGenerationChunk(message=msg, generation_info={"finish_reason": meta["finish_reason"]})
