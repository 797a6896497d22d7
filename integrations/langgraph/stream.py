"""One ChatAgentrt call on the engine's loop: prompt, constrained generation, the streaming
validator, and LangChain chunks.

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

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessageChunk
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk

from agentrt.engine.prefix import fnv1a
from agentrt.model.tokenizer import IncrementalDecoder
from agentrt.sampling import SamplingParams
from agentrt.toolcall import ArgumentsDelta, CallComplete, CallInvalid, TextDelta, ToolCallParser

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


@dataclass
class _Turn:
    text: list[str] = field(default_factory=list)
    args: dict[int, list[str]] = field(default_factory=dict)
    generated: list[int] = field(default_factory=list)
    calls: list[dict] = field(default_factory=list)  # verdicts, for the ledger
    stopped: bool = False


async def run_call(spec: CallSpec, engine, fmt, grammars, router) -> AsyncIterator[ChatGenerationChunk]:
    """Generate one assistant message for spec, yielding LangChain chunks (engine loop only)."""
    rs = await router.acquire(spec.key) if spec.key is not None else None
    if rs is None:
        async for chunk in _generate(spec, engine, fmt, grammars, None):
            yield chunk
        return
    async with rs.lock:
        async for chunk in _generate(spec, engine, fmt, grammars, rs):
            yield chunk


async def _generate(spec: CallSpec, engine, fmt, grammars, rs) -> AsyncIterator[ChatGenerationChunk]:
    if rs is not None:
        prompt, reused = rs.prompt(fmt, spec.messages, spec.tools)
    else:
        prompt, reused = fmt.encode(spec.messages, tools=spec.tools), 0
    call_prefix = f"call_{fnv1a(prompt) & 0xFFFFFFFFFFFF:012x}"
    parser = ToolCallParser(spec.tools, wrapper="hermes", parallel_calls=spec.parallel_tool_calls) \
        if spec.tools and spec.tool_choice != "none" else None
    dec = IncrementalDecoder(engine.tokenizer, skip_special=True)
    turn, usage, finish = _Turn(), None, None
    stream = engine.generate(prompt, spec.params, session=rs and rs.session,
                             constraint=_constraint(spec, grammars))
    async with aclosing(stream) as events:
        async for ev in events:
            turn.generated.extend(ev.token_ids)
            for tok in ev.token_ids:
                if not turn.stopped:
                    for chunk in _feed(turn, parser, dec.push(tok), spec.stop, call_prefix):
                        yield chunk
                    if turn.stopped or (parser is not None and parser.should_stop):
                        turn.stopped = True
                        engine.stop(ev.request_id)
            if ev.finish_reason is not None:
                usage, finish = ev.usage, ev.finish_reason
    if not turn.stopped:
        for chunk in _feed(turn, parser, dec.flush(), spec.stop, call_prefix, closing=True):
            yield chunk
    if rs is not None:
        rs.record(fmt, spec.messages, spec.tools, reused, prompt, turn.generated, _assistant_dict(turn))
    yield _last_chunk(spec, usage, finish, turn)


def _constraint(spec: CallSpec, grammars):
    if spec.json_schema is not None:
        return grammars.for_json_schema(spec.json_schema)
    if spec.constrained and spec.tools:
        return grammars.for_tools(spec.tools, spec.tool_choice, parallel_tool_calls=spec.parallel_tool_calls)
    return None


def _feed(turn: _Turn, parser, text: str, stop: Sequence[str], call_prefix: str,
          closing: bool = False) -> list[ChatGenerationChunk]:
    if parser is None:
        events = [TextDelta(text)] if text else []
    else:
        events = parser.feed(text) + (parser.close() if closing else [])
    out = []
    for ev in events:
        if isinstance(ev, TextDelta):
            piece = _cut_at_stop(turn, ev.text, stop)
            if piece:
                turn.text.append(piece)
                out.append(ChatGenerationChunk(message=AIMessageChunk(content=piece)))
            if turn.stopped:
                break
        elif isinstance(ev, ArgumentsDelta):
            turn.args.setdefault(ev.index, []).append(ev.text)
        elif isinstance(ev, (CallComplete, CallInvalid)):
            out.append(_call_chunk(turn, ev, f"{call_prefix}_{ev.index}"))
    return out


def _cut_at_stop(turn: _Turn, piece: str, stop: Sequence[str]) -> str:
    """piece, cut before the first stop string completed by it (then turn.stopped)."""
    if not stop:
        return piece
    before = "".join(turn.text)
    joined = before + piece
    hits = [i for s in stop if (i := joined.find(s, max(0, len(before) - len(s) + 1))) >= 0]
    if not hits:
        return piece
    turn.stopped = True
    return joined[len(before):min(hits)] if min(hits) >= len(before) else ""


def _call_chunk(turn: _Turn, ev, call_id: str) -> ChatGenerationChunk:
    if isinstance(ev, CallComplete):
        args = "".join(turn.args.get(ev.index, ())) or "{}"
        turn.calls.append({"id": call_id, "type": "function", "function": {"name": ev.name, "arguments": args}})
    else:
        args = f"{_REJECTED}{json.dumps(ev.reason)}) {ev.raw}"
    tc = tool_call_chunk(name=ev.name, args=args, id=call_id, index=ev.index)
    return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[tc]))


def _assistant_dict(turn: _Turn) -> dict:
    """The assistant message as LangGraph will send it back (for the ledger's fingerprint)."""
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(turn.text)}
    if turn.calls:
        msg["tool_calls"] = turn.calls
    return msg


def _last_chunk(spec: CallSpec, usage, finish: str | None, turn: _Turn) -> ChatGenerationChunk:
    meta: dict[str, Any] = {"finish_reason": _finish_reason(finish, turn), "model_name": spec.model_name}
    if spec.key is not None:
        meta["agentrt_session"] = spec.key
    usage_md = None
    if usage is not None:
        meta["computed_prompt_tokens"] = usage.computed_prompt_tokens
        usage_md = {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                    "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                    "input_token_details": {"cache_read": usage.cached_tokens}}
    msg = AIMessageChunk(content="", usage_metadata=usage_md, response_metadata=meta, chunk_position="last")
    return ChatGenerationChunk(message=msg, generation_info={"finish_reason": meta["finish_reason"]})


def _finish_reason(finish: str | None, turn: _Turn) -> str:
    if turn.calls:
        return "tool_calls"
    return {"length": "length", None: "stop"}.get(finish, "stop")


def split_rejected(args: str) -> tuple[str, str | None]:
    """A rejected call's chunk args -> (raw call text, the validator's reason)."""
    if not args.startswith(_REJECTED):
        return args, None
    reason, end = json.JSONDecoder().raw_decode(args, len(_REJECTED))
    return args[end + 2:], reason
