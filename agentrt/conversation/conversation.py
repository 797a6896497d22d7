"""Conversation: the one conversation core under `Agent` and `ChatAgentrt`.

It holds the messages, the token ids the engine session's KV holds for them (`tokens`), the
token offset of every message boundary it knows (`ends`), and the engine session itself. Two
operations:

  * `append(messages)`: encode the new messages after the history (`ChatFormat.extend`). When
    the template renders earlier messages differently once the new ones follow (Qwen2.5 merges
    consecutive tool results into one turn), the tokens fall back to the last boundary that is
    still a prefix and only that suffix is re-encoded; the engine's longest-common-prefix
    rollback recomputes only it. `tokens` then ends with the generation prompt.
  * `round(params, ...)`: one generation. It builds the constraint (the tool grammar in the
    model family's format, or a JSON schema), the streaming parser and the incremental decoder,
    streams the parser's events, stops the request early when the parser (or a stop string) says
    no useful output can follow (`engine.stop`: the usage is kept), and closes the turn: the
    generated ids up to the one that stopped it are kept (ids of the step in flight are dropped,
    so the reply does not depend on timing), a call tag left open by the stop is closed with the
    format's text (the text a grammar forces is already in the tokenizer's spelling: the engine's
    fast-forward; with it off, a reply shaped by a grammar is respelled, `_canonical`, and the
    KV's ids from the first odd split on are recomputed next round), the turn is closed as a finished one, and the assistant message is appended. The last event is a `RoundEnd`.

A consumer that abandons a round (cancellation) leaves the conversation at its prompt: nothing is
appended, and the next round's rollback drops whatever the KV holds beyond it.

Context overflow (`overflow.py`, `ContextPolicy`): oversized tool results are cut when appended,
and a round that would not fit the engine's context first drops old tool rounds / exchanges (or
raises). `originals` keeps each message as given (before any cut), for callers that match
histories by content (the LangGraph ledger).
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import anyio

from agentrt import tracing
from agentrt.checks import check_adapter_name
from agentrt.conversation.call_ids import CALL
from agentrt.conversation.call_ids import call_id as call_id_of
from agentrt.conversation.engine_text import chat_format_of, grammars_of
from agentrt.conversation.overflow import NO_ROOM, ContextPolicy, droppable
from agentrt.conversation.repeats import CallLimits
from agentrt.conversation.round_state import RoundState, TextOnly
from agentrt.conversation.schema_hint import hinted_prompt
from agentrt.engine.context_length import context_overflow
from agentrt.engine.like import EngineLike, SessionLike
from agentrt.errors import ConfigError, EngineClosed
from agentrt.model.tokenizer import IncrementalDecoder
from agentrt.sampling import SamplingParams
from agentrt.toolcall import CallComplete, CallInvalid, ToolCallParser
from agentrt.toolcall.formats import keep_token_ids


@dataclass
class RoundEnd:
    """The last event of `Conversation.round()`."""

    text: str  # assistant text outside tool calls (cut before a stop string)
    calls: list[CallComplete]
    invalid: list[CallInvalid]
    generated: list[int]  # the ids kept for the reply (up to the token that stopped the round)
    usage: Any  # engine Usage of the request (None if the stream ended without one)
    finish_reason: str | None  # the engine's: stop / length / early_stop / ...
    stopped: bool  # the parser or a stop string ended the round early
    message: dict = field(default_factory=dict)  # the assistant message appended
    reasoning: str = ""  # a leading <think> block (kept out of text, calls and message content)

    @property
    def api_finish_reason(self) -> str:
        """The finish reason as API clients name it: "length" when max_tokens cut the round,
        "tool_calls" when it made calls, else "stop" (an early stop included)."""
        if self.finish_reason == "length":
            return "length"
        return "tool_calls" if self.calls else "stop"


class Conversation:
    """Messages + the tokens the session's KV holds + the engine session (None: transient)."""

    def __init__(self, engine: EngineLike, *, tools: Sequence[Mapping[str, Any]] | None = None,
                 session: SessionLike | None = None,
                 chat: Any = None, policy: ContextPolicy | None = None, cache_salt: str | None = None,
                 adapter: str | None = None) -> None:
        """`adapter`: the LoRA adapter (a name loaded on the engine) its rounds run by default."""
        if policy is not None and not isinstance(policy, ContextPolicy):
            raise ConfigError(f"policy must be a ContextPolicy, got {type(policy).__name__}")
        if cache_salt is not None and (not isinstance(cache_salt, str) or session is not None):
            raise ConfigError("cache_salt is a str, for a transient conversation (a session has its own salt)")
        self.engine, self.cache_salt = engine, cache_salt
        self.session: SessionLike | None = session
        self.adapter = check_adapter_name("adapter", adapter)
        self.policy = policy or ContextPolicy()
        self.originals: list[dict] = []  # messages as given (before tool results were cut)
        self.dropped = 0  # messages dropped to fit the context so far
        self.respelled = 0  # replies whose ids were re-tokenized (fast-forward off: `_canonical`)
        self.chat = chat if chat is not None else chat_format_of(engine)
        self.tools = list(tools) if tools else None
        self.messages: list[dict] = []
        self.tokens: list[int] = []
        self.ends: dict[int, int] = {0: 0}  # messages covered -> token offset (no generation prompt)
        self._open = False  # tokens end with the generation prompt

    # -- history -------------------------------------------------------------------------------
    def append(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """Encode `messages` after the history; `tokens` then ends with the generation prompt."""
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence) \
                or not all(isinstance(m, Mapping) for m in messages):
            raise ConfigError("append() takes a list of message dicts")
        given = [dict(m) for m in messages]
        self._encode([*self.messages, *(self._cut(m) for m in given)])
        self.originals += given

    async def add(self, messages: Sequence[Mapping[str, Any]]) -> None:
        """append(), in a worker thread when the messages are big (the event loop stays free)."""
        contents = [m.get("content") for m in messages if isinstance(m, Mapping)] \
            if isinstance(messages, Sequence) else []
        if sum(len(c) for c in contents if isinstance(c, str)) > 65536:
            await anyio.to_thread.run_sync(self.append, messages)
        else:
            self.append(messages)

    def _cut(self, message: dict) -> dict:
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            return {**message, "content": self.policy.cut_tool_result(self.chat.tokenizer, message["content"])}
        return message

    def _encode(self, history: list[dict]) -> None:
        kept, ids, ends = self.chat.extend(history, tuple(self.ends), self.tools, add_generation_prompt=True)
        base = self.ends[kept]
        self.tokens = self.tokens[:base] + ids
        self.ends = {k: v for k, v in self.ends.items() if k <= kept} | {k: base + v for k, v in ends.items()}
        self.messages = history
        self._open = True

    def state(self) -> dict:
        """What it holds, as JSON values (runtime/persist.py keeps it): its messages, tools and
        the exact token ids its KV covers, so a resumed conversation prompts what it would have."""
        return {"messages": self.messages, "originals": self.originals, "tools": self.tools, "tokens": self.tokens,
                "ends": sorted(self.ends.items()), "open": self._open, "dropped": self.dropped}

    def load_state(self, state: dict) -> None:
        """Take back what state() gave (a new conversation under the same tools and template)."""
        self.messages, self.originals = list(state["messages"]), list(state["originals"])
        self.tokens, self.ends = list(state["tokens"]), {int(k): int(v) for k, v in state["ends"]}
        self._open, self.dropped = bool(state["open"]), int(state["dropped"])

    def rewind(self, count: int) -> int:
        """Forget messages after the first `count` (at most; down to a known boundary); returns
        how many are kept."""
        keep = max(k for k in self.ends if k <= count)
        self.messages, self.originals = self.messages[:keep], self.originals[:keep]
        self.tokens = self.tokens[:self.ends[keep]]
        self.ends = {k: v for k, v in self.ends.items() if k <= keep}
        self._open = False
        return keep

    async def fork(self, tag: str | None = None, timeout: float | None = None) -> "Conversation":
        """A new conversation with this one's history (copies of messages, tokens, boundaries) on a
        fork of its session (`Session.fork`: KV pages shared copy-on-write), so the two go on
        independently and the fork's first round prefills only its new messages. Fork between
        rounds (SessionBusy while a round runs). A transient conversation forks into another."""
        other = copy.copy(self)  # shares the engine, chat format and policy; the history is copied
        other.messages, other.originals, other.tokens, other.ends = copy.deepcopy(
            (self.messages, self.originals, self.tokens, self.ends))
        other.tools = list(self.tools) if self.tools else None
        other.session = await self.session.fork(tag, timeout) if self.session is not None else None
        return other

    def fit(self, reply_tokens: int) -> None:
        """Make the prompt + reply_tokens fit the engine's limit (see overflow.py), or raise."""
        limit = self.engine.max_context_tokens
        while (overflow := context_overflow(len(self.tokens), reply_tokens, limit, hint=NO_ROOM)) is not None:
            groups = droppable(self.messages) if self.policy.mode == "trim" else []
            if not groups:
                raise overflow
            drop = set(groups[0])
            first = min(drop)
            keep = [i for i in range(len(self.messages)) if i not in drop]
            messages, originals = [self.messages[i] for i in keep], [self.originals[i] for i in keep]
            self.rewind(first)
            self._encode(messages)
            self.originals = originals
            self.dropped += len(drop)

    # -- one generation ------------------------------------------------------------------------
    async def round(self, params: SamplingParams, *, tool_choice: Any = "auto", parallel_tool_calls: bool = True,
                    constrained: bool = True, json_schema: Any = None, stop: Sequence[str] = (),
                    call_id: Callable[[int], str] = lambda i: call_id_of(CALL, i),
                    content: Callable[[str], str] = lambda text: text, reasoning: bool = False,
                    tag: str | None = None, task: str | None = None, workflow: str | None = None,
                    limits: CallLimits | None = None, schema_hint: bool = True,
                    trace_context: Any = None, adapter: str | None = None) -> AsyncGenerator[Any, None]:
        """Generate the next assistant message: parser events, then one RoundEnd (see the module
        docstring). `call_id(index)` names the message's calls; `content(text)` gives its text;
        reasoning=True also streams a leading <think> block as ReasoningDelta events. `tag` (the
        stage; default the session's), `task`, `workflow`: as in Engine.generate. `limits`
        (`CallLimits`: a repeated call or too many calls end the round; default CallLimits()).
        schema_hint: a reply held to `json_schema` is told the schema's fields first (schema_hint.py;
        for this round only). trace_context: the OpenTelemetry context the round's `chat` span is a
        child of (default: the current one; see agentrt.tracing). `adapter`: this round's LoRA
        adapter (default: the conversation's)."""
        span = tracing.chat(self.engine, params, trace_context)
        with tracing.ending(span):
            if limits is not None and not isinstance(limits, CallLimits):
                raise ConfigError(f"limits must be a CallLimits, got {type(limits).__name__}")
            if not self._open:
                self.append([])  # (re)open the assistant turn
            self.fit(params.max_tokens)
            params = self._with_role_stops(params)
            engine = self.engine
            state, dec, constraint, prompt = self._plan(params, tool_choice, parallel_tool_calls, constrained,
                                                        json_schema, tuple(stop), reasoning, limits, schema_hint)
            async with contextlib.aclosing(engine.generate(prompt or self.tokens, params, session=self.session,
                                                constraint=constraint, tag=tag, task=task, workflow=workflow,
                                                cache_salt=self.cache_salt, adapter=adapter or self.adapter)) as events:
                async for ev in events:
                    for tok in ev.token_ids if not state.stopped else ():
                        state.generated.append(tok)
                        for pe in state.feed(dec.push(tok)):
                            yield pe
                        if state.stopped:
                            engine.stop(ev.request_id)
                            break
                    if ev.finish_reason is not None:
                        state.usage, state.finish = ev.usage, ev.finish_reason
            if not state.stopped:
                for pe in state.feed(dec.flush(), closing=True):
                    yield pe
            elif state.finish in ("stop", "length"):
                # the engine finished before the stop reached it (fast-forward runs many ids a step):
                # the round still ended where the parser stopped it, whatever the timing
                state.finish = "early_stop"
            end = self._close(state, call_id, content)
            if end.calls and self.session is not None:  # keep the KV while the tools run
                with contextlib.suppress(EngineClosed):
                    await self.session.expect_tools([c.name for c in end.calls])
            span.add(end)
            yield end

    def _plan(self, params, tool_choice, parallel_tool_calls, constrained, json_schema, stop, reasoning, limits,
              schema_hint) -> tuple[RoundState, IncrementalDecoder, Any, list[int] | None]:
        """A round's parts: its state (parser and stops), decoder, constraint, and the prompt when
        it differs from `tokens` (a schema hint); `limits` (or the default) applies."""
        engine = self.engine
        # tools and a response schema in one round: the calls, or an answer matching the schema
        # (tool_choice auto in a tagged call format; a bare-JSON format's calls are JSON objects
        # too, so there auto keeps the schema only; required / named: the calls)
        both = json_schema is not None and bool(self.tools) and tool_choice != "none" and (
            bool(self.chat.tool_format.open) or tool_choice not in (None, "auto"))
        tools = self.tools if tool_choice != "none" and (json_schema is None or both) else None
        constraint = self._constraint(tools, tool_choice, parallel_tool_calls, constrained, json_schema, both)
        limits = limits or CallLimits()
        parser = self._parser(tools, parallel_tool_calls, limits, both)
        dec = IncrementalDecoder(engine.tokenizer, skip_special=True,
                                 keep=keep_token_ids(self.chat.tool_format, engine.tokenizer))
        marks = self.chat.template_stops
        state = RoundState(parser, tuple(stop) + marks, reasoning, limits.stop_on_repeat, marks)
        # fast-forward spells forced text canonically in the engine; without it, respell after
        state.constrained = constraint is not None and not engine.config.grammar_fast_forward
        answer = json_schema is not None and not (both and tool_choice not in (None, "auto"))  # (may it answer?)
        prompt = hinted_prompt(self, json_schema, params.max_tokens, both) if answer and schema_hint else None
        return state, dec, constraint, prompt

    def _with_role_stops(self, params: SamplingParams) -> SamplingParams:
        """params whose stop ids hold the template's role headers (a new message ends the reply)."""
        ids = self.chat.role_stop_ids
        if params.ignore_eos or not ids or set(ids) <= set(params.stop_token_ids):
            return params
        return replace(params, stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *ids))))

    def _parser(self, tools, parallel: bool, limits: CallLimits, answer: bool = False) -> Any:
        """The round's parser. It enforces limits.max_calls: it stops at the closing brace of the
        last allowed call (without parallel calls it allows one call anyway). With a schema
        answer beside the tools, a JSON object at the start is that answer, not a bare call."""
        if not tools:
            return TextOnly()
        fmt = replace(self.chat.tool_format, bare=False) if answer else self.chat.tool_format
        return ToolCallParser(tools, parallel_calls=parallel, max_calls=limits.max_calls if parallel else None,
                              **fmt.parser_options())

    def _constraint(self, tools, tool_choice, parallel, constrained, json_schema, both=False):
        if both:
            return grammars_of(self.engine).for_tools(tools, tool_choice, parallel_tool_calls=parallel,
                                                      answer_schema=json_schema)
        if json_schema is not None:
            return grammars_of(self.engine).for_json_schema(json_schema)
        if tools and constrained:
            return grammars_of(self.engine).for_tools(tools, tool_choice, parallel_tool_calls=parallel)
        return None

    def _close(self, state: RoundState, call_id: Callable[[int], str], content: Callable[[str], str]) -> RoundEnd:
        text = "".join(state.text)
        message: dict[str, Any] = {"role": "assistant", "content": content(text)}
        if state.calls:
            message["tool_calls"] = [
                {"id": call_id(c.index), "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for c in state.calls]
        reply = state.generated + self._closing_ids(state)
        if state.constrained:
            spelled = self._canonical(reply)
            self.respelled += spelled != reply
            reply = spelled
        self.tokens += self.chat.encode_assistant_tokens(reply)
        self.messages.append(message)
        self.originals.append(message)
        self.ends[len(self.messages)] = len(self.tokens)
        self._open = False
        return RoundEnd(text, state.calls, state.invalid, state.generated, state.usage, state.finish,
                        state.stopped, message, "".join(state.thoughts))


    def _canonical(self, ids: list[int]) -> list[int]:
        """The reply's text tokenized as the tokenizer would (the KV keeps the generated ids).
        The fallback for engines without grammar fast-forward (EngineConfig.grammar_fast_forward):
        with it the forced text is already canonical, and the model's own choices are kept as
        generated, as in free text.

        Constrained decoding often spells fixed text in odd pieces (`<`,`t`,`oo`,`l`,... for
        `<tool_call>`: the grammar allows every prefix and a small model may prefer one); kept
        in the history, such ids pull later rounds off the distribution the model was trained
        on (measured on SmolLM2-135M: a garbled answer after an oddly split call, the right one
        with the same text tokenized normally). The next round's rollback recomputes the reply
        from its first differing id: tens of tokens.
        """
        eos = ids[-1:] if ids and ids[-1] in self.chat.tokenizer.eos_token_ids else []
        body = ids[:len(ids) - len(eos)]
        if not self.chat.tokenizer.byte_level or not body:
            return ids
        text = b"".join(self.chat.tokenizer.token_bytes(i) for i in body).decode("utf-8", errors="replace")
        if "\ufffd" in text:  # not valid UTF-8 on its own: keep the ids
            return ids
        return self.chat.tokenize_text(text) + eos

    def _closing_ids(self, state: RoundState) -> list[int]:
        """Ids of the format's closing text when an early stop left a call block open (the close
        tag; a list format's "]" too)."""
        closing = self.chat.tool_format.closing_text("".join(state.raw).rstrip()) if state.stopped else ""
        return self.chat.tokenizer.encode(closing, special=True) if closing else []
