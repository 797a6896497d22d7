"""Tool-call formats of the model families: how a model writes calls, so that the streaming
parser reads them and the grammar (tool_choice required / named) makes the model write them.

    hermes   <tool_call>{"name": "f", "arguments": {...}}</tool_call>, blocks separated by "\\n"
             (ChatFormat's fallback for templates without tools, SmolLM2; NousHermes);
    qwen     the same with the template's whitespace inside the tags (Qwen2.5 / Qwen3:
             "<tool_call>\\n{...}\\n</tool_call>");
    llama3   a bare {"name": "f", "parameters": {...}} as the whole message (Llama 3.1 / 3.2 JSON
             tool calling; one call per message, as its template renders; a leading
             <|python_tag|> is accepted);
    mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (Mistral v3 tokenizers);
    phi4     <|tool_call|>[{"name": "f", "arguments": {...}}, ...]<|/tool_call|> (Phi-4-mini-instruct;
             its control tokens). Its template takes no tool calls, so the format is what the
             model writes: Gorilla BFCL's Phi-4-mini handler (bfcl/model_handler/local_inference/
             phi_fc.py) reads `<|tool_call|>` + a JSON list + `<|/tool_call|>` as "the normal
             situation", and Microsoft's Phi-4-mini ONNX function-calling cookbook constrains the
             output to `<|tool_call|>` + JSON. vLLM's `phi4_mini_json` parser reads
             `functools[...]` instead: a convention its own example template
             (tool_chat_template_phi4_mini.jinja) instructs, not the model's template;
    gemma    a bare {"name": "f", "parameters": {...}} as the whole message, one call (Gemma 3: no
             tool tokens; the JSON convention of Google's "Function calling with Gemma" guide,
             ai.google.dev/gemma/docs/capabilities/function-calling).

`detect_tool_format(chat)` picks one from the chat template: Phi-4-mini's and Gemma 3's tool
conventions (conversation/conventions.py) give phi4 and gemma; another template without tools gets
the fallback (hermes); otherwise the template is rendered on a probe conversation with one tool
call and the format is read off the rendering (tags, whitespace, arguments key). In `auto`, the parser
also takes a bare call object or a ```json fence at the start of a message (`bare`): on by default
for models whose call tag is not a dedicated control token, since those models often answer that
way when unconstrained.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrt.errors import ConfigError
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG

# the JSON style the grammar writes (json.dumps' default separators, no other whitespace)
ITEM_SEP, KEY_SEP = ", ", ": "

_PROBE_TOOL = {"type": "function", "function": {
    "name": "probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {
        "x": {"type": "integer"}}, "required": ["x"]}}}
_PROBE_USER = "Probe the tool."
_PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": "probe_tool", "arguments": {"x": 7}}}


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls (see the module docstring)."""

    name: str
    open: str = OPEN_TAG  # text that opens a call block; "" = bare JSON
    close: str = CLOSE_TAG
    inner: str = ""  # whitespace the template writes just inside open and close
    args_key: str = "arguments"
    separator: str = "\n"  # between blocks (list formats: between the calls inside the list)
    list_calls: bool = False  # one block holds a JSON list of calls (mistral)
    parallel: bool = True  # the template renders several calls in one message
    bare: bool = True  # auto: also a bare call object / ```json fenced call at message start

    def __post_init__(self) -> None:
        for tag in (self.open, self.close):
            if tag and tag[0] in tag[1:]:  # the parser's tag matching relies on it
                raise ConfigError(f"a tool-call tag must not repeat its first character: {tag!r}")
        if self.args_key not in ("arguments", "parameters"):
            raise ConfigError(f"args_key must be 'arguments' or 'parameters', got {self.args_key!r}")

    @property
    def block_begin(self) -> str:
        """Text before each call object (list formats: the list's opening is separate)."""
        return "" if self.list_calls else self.open + self.inner

    @property
    def block_end(self) -> str:
        """Text after each call object's closing brace."""
        return "" if self.list_calls else self.inner + self.close

    @property
    def trigger(self) -> str:
        """What starts a call when the model may also write text (tool_choice auto)."""
        return self.open or '{"name"'

    def call_prefix(self, name: str) -> str:
        """A call object up to its arguments value, in the grammar's fixed JSON style."""
        return "{" + json.dumps("name") + KEY_SEP + json.dumps(name, ensure_ascii=False) + ITEM_SEP \
            + json.dumps(self.args_key) + KEY_SEP

    def render_call(self, name: str, arguments: Any) -> str:
        """One call written as the grammar writes it (tests, scripted model outputs)."""
        obj = self.call_prefix(name) + json.dumps(arguments, ensure_ascii=False, separators=(ITEM_SEP, KEY_SEP)) + "}"
        return obj if self.list_calls else self.open + self.inner + obj + self.inner + self.close

    def render_calls(self, calls: Sequence[tuple[str, Any]]) -> str:
        body = self.separator.join(self.render_call(n, a) for n, a in calls)
        return self.open + "[" + body + "]" + self.close if self.list_calls else body

    def closing_text(self, raw: str) -> str:
        """The text that closes the call block an early stop at a call's final '}' left open in
        `raw` (the reply so far): "]" and the close tag for list formats; "" when none is open."""
        if not self.open or self.open not in raw or not raw.endswith("}"):
            return ""
        if self.close and raw.count(self.open) <= raw.count(self.close):
            return ""
        return ("]" if self.list_calls else self.inner) + self.close

    def parser_options(self) -> dict[str, Any]:
        """ToolCallParser keyword arguments for this format (tool_choice auto)."""
        if not self.open:
            return {"wrapper": "json", "fences": True}
        return {"wrapper": "auto" if self.bare else "hermes", "open_tag": self.open,
                "close_tag": self.close, "fences": self.bare}


HERMES = ToolFormat("hermes")
QWEN = ToolFormat("qwen", inner="\n")
LLAMA3 = ToolFormat("llama3", open="", close="", args_key="parameters", separator="", parallel=False)
MISTRAL = ToolFormat("mistral", open="[TOOL_CALLS]", close="", separator=ITEM_SEP, list_calls=True, bare=False)
PHI4 = ToolFormat("phi4", open="<|tool_call|>", close="<|/tool_call|>", separator=ITEM_SEP, list_calls=True,
                  bare=False)
GEMMA = ToolFormat("gemma", open="", close="", args_key="parameters", parallel=False)
FORMATS = {f.name: f for f in (HERMES, QWEN, LLAMA3, MISTRAL, PHI4, GEMMA)}


def detect_tool_format(chat) -> ToolFormat:
    """The format `chat` (a ChatFormat) renders tool calls in; HERMES for the fallback."""
    convention = chat.tool_convention
    if convention == "phi4":
        return replace(PHI4, bare=PHI4.open not in chat.tokenizer.special_tokens)
    if convention == "gemma":
        return GEMMA
    if convention != "native":
        return HERMES
    msgs = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": None, "tool_calls": [_PROBE_CALL]}]
    try:
        text = chat.render(msgs, [_PROBE_TOOL], add_generation_prompt=False)
    except Exception:  # a template that refuses the probe (odd roles, ...): keep the fallback tags
        return HERMES
    special = set(chat.tokenizer.special_tokens)
    call = text[text.rfind(_PROBE_USER):]  # the assistant turn (the tool prompt may quote the tags)
    if "[TOOL_CALLS]" in call:
        return replace(MISTRAL, bare="[TOOL_CALLS]" not in special)
    tagged = re.search(re.escape(OPEN_TAG) + r"([ \n]*)\{", call)
    if tagged:
        fmt = QWEN if tagged.group(1) else HERMES
        return replace(fmt, inner=tagged.group(1), bare=OPEN_TAG not in special)
    if re.search(r'"parameters"\s*:', call):
        return LLAMA3
    return HERMES


def keep_token_ids(fmt: ToolFormat, tokenizer) -> frozenset[int]:
    """Control tokens the format's tags are made of: the decoder must not skip them."""
    ids = {tokenizer.special_tokens.get(tag) for tag in (fmt.open, fmt.close) if tag}
    return frozenset(i for i in ids if i is not None)
