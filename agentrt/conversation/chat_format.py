"""Chat formatting: OpenAI-style messages (+ tool schemas) -> prompt text and token ids.

Messages are dicts: {"role": "system"|"user"|"assistant"|"tool", "content": str | [text parts] | None}.
Assistant messages may carry `tool_calls` ([{"id", "type": "function", "function": {"name",
"arguments": str | dict}}]); tool messages need `tool_call_id` (and may have `name`).

Rendering uses the model's own jinja2 chat template (built-in ChatML when there is none) in a
sandbox, with `raise_exception`, `strftime_now` and `tojson` as transformers provides them. A
template handles tools natively when it uses the variable `tools` and mentions `tool_calls`; in
that case tool calls/schemas are rendered by the template, and any control-token text inside them
is rejected (ChatTemplateError). Phi-4-mini's and Gemma 3's templates take tools by their own
conventions (`tool_convention`, conversation/conventions.py). Other templates (SmolLM2's) get the
**fallback tool format**, applied by rewriting messages before the model's template runs:
  * the tool schemas go into the system message (one is added if the conversation has none):
    `<tools>` + one JSON schema per line + `</tools>`, plus an instruction to answer with
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
  * an assistant message's tool calls are appended to its content in that same form;
  * a tool result becomes a *user* turn whose content is `<tool_response>\\n{content}\\n</tool_response>`
    (one turn per result, never merged, so appending messages never changes earlier turns).

Token-level contract. Every message's content (after the rewrite above) is data (a convention's
template-made TAIL is not: it is checked for control-token text instead): it is rendered
as a random sentinel, so control tokens are taken only where the template text has them; the text
between two control tokens (template text and contents together) is tokenized as one piece with
special-token parsing off -- as tokenizing the whole rendering would, except that a tool result
holding `<|im_start|>` can never produce the control token. Text is also cut at every message
boundary that is a prefix of the whole rendering and before the generation prompt, so
`encode(prev, add_generation_prompt=False) + encode_delta(prev, new)` equals `encode(prev + new)`
by construction. Templates that `| trim` content are detected and handled; templates that
otherwise rewrite content are refused. An eos the template writes only without a generation
prompt (Phi-4-mini's) ends a document, not a turn: renderings here leave it out. A template that
re-renders earlier turns once later ones exist (Qwen2.5 and Gemma 3's convention merge
consecutive tool results; Mistral moves the tool list to the last user turn) is not extendable by a pure delta: `extend()` then re-encodes from the last boundary that still
holds (what `Conversation.append` does); `encode_delta` raises.

Model output: `encode(prev) + encode_assistant_tokens(generated_ids)` is the token history after a
generated turn (`Conversation` keeps free text as generated, and re-tokenizes grammar-shaped
replies with `tokenize_text`).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from agentrt.conversation.conventions import PREPARE, detect_convention, joined
from agentrt.conversation.messages import as_list, check_tool, normalize
from agentrt.conversation.template_stops import role_stop_ids, template_stops
from agentrt.conversation.templates import CHATML_TEMPLATE, compile_template
from agentrt.errors import ChatTemplateError
from agentrt.model.tokenizer import Tokenizer
from agentrt.toolcall.formats import ToolFormat, detect_tool_format


class ChatFormat:
    """Renders and tokenizes conversations for one tokenizer + chat template (immutable, thread-safe)."""

    def __init__(self, tokenizer: Tokenizer, template: str | None = None, tool_format: ToolFormat | None = None) -> None:
        self.tokenizer = tokenizer
        self.template_source = template or tokenizer.chat_template or CHATML_TEMPLATE
        self._template, self.native_tools = compile_template(self.template_source)
        self.tool_convention = detect_convention(self.template_source, self.native_tools)
        # content i renders as PUA-char + nonce + i + PUA-char; the nonce makes forging one impossible
        self._nonce = secrets.token_hex(8)
        self._sentinel_re = re.compile("\ue000" + self._nonce + r"(\d+)\ue001")
        self._control = tuple(tokenizer.special_tokens)
        self._control_re = re.compile("(" + "|".join(re.escape(t) for t in sorted(self._control, key=len, reverse=True))
                                      + ")") if self._control else None
        self._strip_content, self._doc_end = False, ""  # the probes below need the raw rendering
        self._strip_content = self._probe_content_mode()
        user = self._sentinelize([{"role": "user", "content": "x"}], {})
        self._doc_end = self._probe_doc_end(user)
        base, whole = self._render(user, None, False), self._render(user, None, True)
        if not whole.startswith(base):
            raise ChatTemplateError("the template's generation prompt rewrites the conversation before it")
        gen = whole[len(base):]
        self._gen_prompt_ids = tuple(self._tokenize(gen, {}))
        closed = self._render(self._sentinelize([{"role": "user", "content": "x"},
                                                 {"role": "assistant", "content": "y"}], {}), None, False)
        self._turn_end_ids = tuple(self._tokenize(self._sentinel_re.split(closed)[-1], {}))
        self.tool_format = tool_format if tool_format is not None else detect_tool_format(self)
        # the template's tool-result markers and role headers: a reply ends where the model starts one
        self.template_stops = template_stops(self)
        self.role_stop_ids = role_stop_ids(self)

    def with_tool_format(self, tool_format: ToolFormat) -> "ChatFormat":
        """A copy that writes and reads tool calls in `tool_format`."""
        if not isinstance(tool_format, ToolFormat):
            raise ChatTemplateError(f"tool_format must be a ToolFormat, got {tool_format!r}")
        other = copy.copy(self)
        other.tool_format = tool_format
        other.template_stops = template_stops(other)
        other.role_stop_ids = role_stop_ids(other)
        return other

    # -- public API ---------------------------------------------------------------------------------
    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str:
        """The prompt text, as the template renders it (what transformers' apply_chat_template gives)."""
        return self._render(joined(self._prepare(messages, tools)), tools, add_generation_prompt)

    def encode(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> list[int]:
        return self.encode_delta((), messages, tools, add_generation_prompt)

    def encode_delta(self, prev_messages: Sequence[Mapping[str, Any]], new_messages: Sequence[Mapping[str, Any]],
                     tools: Sequence[Mapping[str, Any]] | None = None, add_generation_prompt: bool = True) -> list[int]:
        """Token ids that extend `encode(prev_messages, add_generation_prompt=False)` with new_messages.

        Raises ChatTemplateError when the template renders prev_messages differently once the new
        ones follow (e.g. Qwen2.5 merging consecutive tool results): use `extend()` (what
        `Conversation` does), which then re-encodes the smallest affected suffix instead.
        """
        if not prev_messages and not new_messages:
            raise ChatTemplateError("the conversation is empty; pass at least one message")
        start = len(prev_messages)
        kept, ids, _ = self.extend([*prev_messages, *new_messages], (start,), tools, add_generation_prompt)
        if kept != start:
            raise ChatTemplateError(
                "the chat template renders earlier messages differently once later ones are added, so "
                "this conversation cannot be extended by a pure delta; use ChatFormat.extend() or Conversation"
            )
        return ids

    def extend(self, messages: Sequence[Mapping[str, Any]], cuts: Sequence[int],
               tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> tuple[int, list[int], dict[int, int]]:
        """Encode messages as a continuation of the tokens already held for one of its prefixes.

        cuts: message counts k whose tokens the caller holds (messages[:k] encoded, no generation
        prompt). Returns (k, ids, ends): the largest k in cuts (or 0) whose rendering is a prefix of
        the whole rendering, the ids of the rest, and for each later message boundary that is a
        prefix of the whole rendering, its message count -> offset in ids. A template that
        re-renders earlier turns (merged tool results) thus only re-encodes the affected suffix.
        """
        keys: dict[tuple[int, str], int] = {}  # (message index, content) -> sentinel number
        whole = self._render(self._sentinelize(self._prepare(messages, tools), keys), tools, add_generation_prompt)
        kept, text = 0, ""
        for k in sorted({c for c in cuts if 0 < c <= len(messages)}, reverse=True):
            rendered = self._head(messages[:k], tools, keys)
            if whole.startswith(rendered):
                kept, text = k, rendered
                break
        cut_texts = {}
        for k in range(kept + 1, len(messages) + 1):
            rendered = self._head(messages[:k], tools, keys)
            if whole.startswith(rendered) and len(rendered) >= len(text):
                cut_texts[k] = rendered
        contents = {n: c.strip() if self._strip_content else c for (_, c), n in keys.items()}
        ids: list[int] = []
        ends: dict[int, int] = {}
        for k, rendered in cut_texts.items():  # ascending k: each chunk ends at a message boundary
            ids += self._tokenize(rendered[len(text):], contents)
            ends[k], text = len(ids), rendered
        ids += self._tokenize(whole[len(text):], contents)
        return kept, ids, ends

    def _head(self, messages: Sequence[Mapping[str, Any]], tools: Any, keys: dict[tuple[int, str], int]) -> str:
        """The sentinel rendering of a prefix of the conversation, without generation prompt
        (prepared on its own: a convention may merge its last message with later ones)."""
        return self._render(self._sentinelize(self._prepare(messages, tools), keys), tools, False)

    def tokenize_text(self, text: str) -> list[int]:
        """Ids of text the model wrote: its control tokens stay control tokens, the rest is
        tokenized as one piece between them (as the whole rendering is)."""
        return self._tokenize(text, {})

    def generation_prompt_tokens(self) -> list[int]:
        """Ids the template appends to open the assistant turn (e.g. `<|im_start|>assistant\\n`)."""
        return list(self._gen_prompt_ids)

    def encode_assistant_tokens(self, generated_ids: Sequence[int]) -> list[int]:
        """Model output (after the generation prompt) closed as a finished assistant turn.

        A trailing stop token (any eos id) is replaced by the template's own end-of-turn text, so the
        result continues `encode(prev)` exactly like `encode(prev + [assistant message])` would.
        """
        ids = list(generated_ids)
        if ids and ids[-1] in self.tokenizer.eos_token_ids:
            ids.pop()
        return ids + list(self._turn_end_ids)

    # -- rendering ----------------------------------------------------------------------------------
    def _render(self, messages: list[dict[str, Any]], tools: Any, add_generation_prompt: bool) -> str:
        tok = self.tokenizer
        try:
            text = self._template.render(
                messages=messages, tools=list(tools) if tools and self.native_tools else None,
                add_generation_prompt=add_generation_prompt, bos_token=self._token_text(tok.bos_token_id),
                eos_token=self._token_text(tok.eos_token_ids[0] if tok.eos_token_ids else None),
                pad_token=self._token_text(tok.pad_token_id),
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template rejected the conversation: {exc}") from exc
        end = self._doc_end
        return text[:-len(end)] if end and not add_generation_prompt and text.endswith(end) else text

    def _token_text(self, token_id: int | None) -> str:
        return (self.tokenizer.id_to_token(token_id) or "") if token_id is not None else ""

    def _tokenize(self, chunk: str, contents: Mapping[int, str]) -> list[int]:
        """Ids of rendered text: control tokens only where the template wrote them, and the text
        between them (template text and contents together) tokenized as one piece, as tokenizing
        the whole rendering would; a content's control-token text stays ordinary text."""
        parts = self._sentinel_re.split(chunk)  # [template, index, template, index, ..., template]
        ids: list[int] = []
        text: list[str] = []
        for n, part in enumerate(parts):
            if n % 2:
                text.append(contents[int(part)])
                continue
            pieces = self._control_re.split(part) if self._control_re else [part]
            for m, piece in enumerate(pieces):  # [text, control, text, ...]
                if m % 2:
                    ids += self.tokenizer.encode("".join(text), special=False) if text else []
                    ids.append(self.tokenizer.special_tokens[piece])
                    text = []
                elif piece:
                    text.append(piece)
        if text:
            ids += self.tokenizer.encode("".join(text), special=False)
        return ids

    def _sentinelize(self, messages: list[dict[str, Any]], keys: dict[tuple[int, str], int]) -> list[dict[str, Any]]:
        """Copies whose non-empty string contents are sentinels (each TAIL after its sentinel).
        keys: (message index, content) -> sentinel number, shared by the renderings one
        encoding compares, so a sentinel stands for one content in all of them."""
        out = []
        for i, msg in enumerate(messages):
            content = msg.get("content")
            if isinstance(content, str) and content:
                n = keys.setdefault((i, content), len(keys))
                msg = {**msg, "content": f"\ue000{self._nonce}{n}\ue001"}
            out.append(msg)
        return joined(out)

    def _probe_content_mode(self) -> bool:
        """False if the template inserts content verbatim, True if it trims it; else ChatTemplateError."""
        probe = [{"role": "user", "content": " probe u \n"}, {"role": "assistant", "content": "\n probe a "},
                 {"role": "user", "content": "probe\tz"}]
        real = self._render(probe, None, True)
        keys: dict[tuple[int, str], int] = {}
        rendered = self._render(self._sentinelize(probe, keys), None, True)
        contents = {n: c for (_, c), n in keys.items()}
        for strip in (False, True):
            swap = (lambda m: contents[int(m.group(1))].strip()) if strip else (lambda m: contents[int(m.group(1))])
            if self._sentinel_re.sub(swap, rendered) == real:
                return strip
        raise ChatTemplateError(
            "the chat template rewrites message content beyond trimming, so content cannot be tokenized "
            "separately; pass template= with one that inserts message['content'] as is"
        )

    def _probe_doc_end(self, user: list[dict[str, Any]]) -> str:
        """The eos text a template writes only without a generation prompt (Phi-4-mini's
        `{{ eos_token }}`): it ends a document, not a turn, so renderings here leave it out
        (else no rendering would be a prefix of a longer one); "" for other templates."""
        base, whole = self._render(user, None, False), self._render(user, None, True)
        tok = self.tokenizer
        eos = self._token_text(tok.eos_token_ids[0] if tok.eos_token_ids else None)
        if eos and base.endswith(eos) and not whole.startswith(base) and whole.startswith(base[:-len(eos)]):
            return eos
        return ""

    # -- message preparation --------------------------------------------------------------------------
    def _prepare(self, messages: Sequence[Mapping[str, Any]], tools: Any) -> list[dict[str, Any]]:
        """Validated messages with the template's tool convention applied (conventions.py)."""
        msgs = [normalize(i, m) for i, m in enumerate(as_list(messages, "messages"))]
        tool_list = [check_tool(t) for t in as_list(tools, "tools")] if tools is not None else []
        if self.tool_convention in ("native", "phi4"):  # calls / schemas become template text
            self._reject_control_text(msgs, tool_list)
        if self.tool_convention == "native":
            return msgs
        return PREPARE[self.tool_convention](msgs, tool_list)

    def _reject_control_text(self, msgs: list[dict[str, Any]], tools: list[Mapping[str, Any]]) -> None:
        # Native templates put tool calls / schemas in template text (special parsing on): refuse forgeries.
        outside = json.dumps([{k: v for k, v in m.items() if k != "content"} for m in msgs] + tools,
                             ensure_ascii=False)
        for token in self._control:
            if token in outside:
                raise ChatTemplateError(f"control token {token!r} found in tool calls or tool schemas; remove it")


def build_chat_format(tokenizer: Any, config: Any = None) -> "ChatFormat":
    """The ChatFormat an engine with `config` (an EngineConfig; None: defaults) uses: the
    tokenizer's template, with the tool-call format and bare-call option the config names."""
    import dataclasses

    from agentrt.toolcall.formats import FORMATS

    name, bare = (config.tool_format, config.bare_tool_calls) if config is not None else (None, None)
    chat = ChatFormat(tokenizer, tool_format=FORMATS.get(name) if name is not None else None)
    if bare is not None:
        chat = chat.with_tool_format(dataclasses.replace(chat.tool_format, bare=bare))
    return chat
