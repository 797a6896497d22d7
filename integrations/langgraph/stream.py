"""One ChatAgentrt call on the engine's loop: a `Conversation.round()` (the conversation core
the agents use too) turned into LangChain chunks.

Chunks: assistant text streams as it is decoded. A tool call is emitted as one
`tool_call_chunk` when the validator's verdict arrives (a call is tens of tokens; ToolNode cannot
run it before it is complete anyway), so a call the validator rejects never reaches
`tool_calls`: its chunk's `args` start with `(rejected: <reason>)`, which LangChain's chunk
merge files under `invalid_tool_calls`. The last chunk carries usage (with
`input_token_details.cache_read` = prompt tokens served from KV already held) and the finish
reason. Call ids are derived from the prompt, so the streamed and the non-streamed call of the
same prompt give the same ids.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import anyio
from langchain_core.messages import AIMessage, AIMessageChunk, InputTokenDetails, UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from agentrt.conversation.conversation import Conversation, RoundEnd
from agentrt.conversation.repeats import CallLimits
from agentrt.conversation.reply import call_id, call_prefix, finish_reason
from agentrt.conversation.router import routed_conversation
from agentrt.errors import AgentrtError, GenerationTimeout, PoolExhausted
from agentrt.sampling import SamplingParams
from agentrt.toolcall import ArgumentsDelta, CallComplete, CallInvalid, TextDelta
from agentrt.workflow import TaskContext

_REJECTED = "(rejected: "


@dataclass
class CallSpec:
    """Everything one call needs, resolved on the caller's side."""

    messages: list[dict]
    tools: list[dict] | None
    tool_choice: Any
    parallel_tool_calls: bool
    constrained: bool
    json_schema: dict | None
    params: SamplingParams
    stop: Sequence[str]
    key: str | None
    model_name: str
    tag: str | None = None  # the request's stage (the LangGraph node), None: the session's tag
    task: TaskContext | None = None  # resolved on the caller's side (the engine's loop may be another)
    limits: CallLimits | None = None  # repeated / too many calls end the reply
    trace: Any = None  # the caller's OpenTelemetry context (agentrt.tracing; None: off, or a remote call)
    timeout: float | None = None  # seconds the call may run
    retries: int = 0  # attempts after a transient failure before the first chunk
    model_named: bool = True  # the caller chose model_name (False: a remote call lets the server's model answer)
    adapter: str | None = None  # the LoRA adapter the call runs (a remote server: its `model`)


async def run_call(spec: CallSpec, engine, fmt, router) -> AsyncIterator[ChatGenerationChunk]:
    """Generate one assistant message for spec, yielding LangChain chunks (engine loop only).

    Each attempt runs under the call's timeout (GenerationTimeout past it). An attempt that fails
    with a transient error (no sequence slot in time, the timeout) before its first chunk is made
    again, up to `spec.retries` times; once a chunk has gone out, the error is the caller's."""
    for attempt in range(spec.retries + 1):
        sent = False
        try:
            with _deadline(spec.timeout):
                async with routed_conversation(router, spec.key, spec.messages, spec.tools, tag=spec.tag,
                                               chat=fmt) as (conv, _):
                    async for chunk in _generate(spec, conv):
                        sent = True
                        yield chunk
            return
        except (PoolExhausted, GenerationTimeout):
            if sent or attempt == spec.retries:
                raise


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    if seconds is None:
        yield
        return
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError as exc:
        if isinstance(exc, AgentrtError):  # PoolExhausted is a TimeoutError too
            raise
        raise GenerationTimeout(f"the call ran past its timeout of {seconds:g} s and was cancelled; raise "
                                "ChatAgentrt(timeout=...) or lower max_tokens") from None


async def _generate(spec: CallSpec, conv: Conversation) -> AsyncIterator[ChatGenerationChunk]:
    chunker = Chunker(call_prefix(conv.tokens))
    end = None
    task, workflow = (spec.task.task_id, spec.task.workflow) if spec.task is not None else (None, None)
    rounds = conv.round(spec.params, tool_choice=spec.tool_choice, parallel_tool_calls=spec.parallel_tool_calls,
                        constrained=spec.constrained, json_schema=spec.json_schema, stop=spec.stop,
                        call_id=chunker.call_id, tag=spec.tag, task=task, workflow=workflow, limits=spec.limits,
                        trace_context=spec.trace, adapter=spec.adapter)
    async with aclosing(rounds) as events:
        async for ev in events:
            if isinstance(ev, RoundEnd):
                end = ev
            elif (chunk := chunker(ev)) is not None:
                yield chunk
    if end is None:  # (a round's stream ends with its RoundEnd)
        raise AgentrtError("the round ended without its RoundEnd")
    yield _last_chunk(spec, end)


class Chunker:
    """Parser events -> LangChain chunks (text as it decodes, one chunk per call verdict)."""

    def __init__(self, call_prefix: str) -> None:
        self.call_prefix = call_prefix
        self._args: dict[int, list[str]] = {}

    def call_id(self, index: int) -> str:
        return call_id(self.call_prefix, index)

    def __call__(self, ev: Any) -> ChatGenerationChunk | None:
        if isinstance(ev, TextDelta):
            return ChatGenerationChunk(message=AIMessageChunk(content=ev.text))
        if isinstance(ev, ArgumentsDelta):
            self._args.setdefault(ev.index, []).append(ev.text)
            return None
        if isinstance(ev, CallComplete):
            args = "".join(self._args.get(ev.index, ())) or "{}"
        elif isinstance(ev, CallInvalid):
            args = f"{_REJECTED}{json.dumps(ev.reason)}) {ev.raw}"
        else:
            return None
        tc = tool_call_chunk(name=ev.name, args=args, id=self.call_id(ev.index), index=ev.index)
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[tc]))


def _last_chunk(spec: CallSpec, end: RoundEnd) -> ChatGenerationChunk:
    usage = end.usage
    meta: dict[str, Any] = {"finish_reason": finish_reason(end), "model_name": spec.model_name}
    if spec.key is not None:
        meta["agentrt_session"] = spec.key
    usage_md = None
    if usage is not None:
        meta["computed_prompt_tokens"] = usage.computed_prompt_tokens
        usage_md = usage_metadata(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
    msg = AIMessageChunk(content="", usage_metadata=usage_md, response_metadata=meta, chunk_position="last")
    return ChatGenerationChunk(message=msg, generation_info={"finish_reason": meta["finish_reason"]})


def split_rejected(args: str) -> tuple[str, str | None]:
    """A rejected call's chunk args -> (raw call text, the validator's reason)."""
    if not args.startswith(_REJECTED):
        return args, None
    reason, end = json.JSONDecoder().raw_decode(args, len(_REJECTED))
    return args[end + 2:], reason


def usage_metadata(prompt: int, completion: int, cached: int) -> UsageMetadata:
    """A call's token counts as LangChain's usage metadata."""
    return UsageMetadata(input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion,
                         input_token_details=InputTokenDetails(cache_read=cached))


def aggregate(chunks: list[ChatGenerationChunk]) -> ChatResult:
    """One call's chunks as its ChatResult; a rejected call's chunk args back to its raw text and
    the validator's reason (the `error` of its invalid_tool_calls entry)."""
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    m = total.message
    if not isinstance(m, AIMessageChunk):  # (every chunk of a call is an AIMessageChunk)
        raise AgentrtError(f"a call's chunks add up to a {type(m).__name__}, not an AIMessageChunk")
    invalid = []
    for bad in m.invalid_tool_calls:
        args, reason = split_rejected(bad.get("args") or "")
        invalid.append({**bad, "args": args, "error": reason or bad.get("error")})
    msg = AIMessage(content=m.content, tool_calls=m.tool_calls, invalid_tool_calls=invalid,
                    usage_metadata=m.usage_metadata, response_metadata=m.response_metadata, id=m.id)
    return ChatResult(generations=[ChatGeneration(message=msg, generation_info=total.generation_info)])
