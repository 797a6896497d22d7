"""The chat template's own markers as stop strings of an assistant reply.

A small model that has just read a tool result often goes on writing the template's wrapper of
the next one (`<tool_response>\\n{"city": ...`) instead of answering; the turn then handed that
markup to the user. `template_stops(chat)` renders a probe conversation whose tool result is a
unique marker and reads the template's text around it: every markup-looking piece there
(`<tag>`, `</tag>`, `[TAG]`) that is plain text to the tokenizer (not a control token, which the
decoder drops anyway) and is not the family's own call tags becomes a stop string. The reply ends
where the model starts writing one, and the text before it is kept; a reply that begins with one
(the model restating a tool result in its wrapper) drops it and ends at the next
(`RoundState.markers`), so the user gets the restated text without the markup.

`role_stop_ids(chat)` does the same for the role headers: the control tokens the template writes
between two messages (`<|im_start|>`, `<|start_header_id|>`, `<start_of_turn>`, `<|user|>`,
`[INST]`, and the end-of-turn tokens before them). A model that starts a new message mid-reply
(a user turn it imagines) ends its own there; the decoder would drop the token and hand on
`user\n...` as the answer. The call format's tags and reasoning tags are never among them.
"""

from __future__ import annotations

import re
from typing import Any

from agentrt.errors import ChatTemplateError

_MARK = "\ue000agentrt-tool-result\ue001"
_MARKUP = re.compile(r"</?[A-Za-z_][\w|/\-]{1,40}>|\[/?[A-Z][A-Z_]{2,30}\]")
_CALL = {"id": "call_probe", "type": "function", "function": {"name": "probe_tool", "arguments": {"x": 7}}}
_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "probe", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}


def template_stops(chat: Any) -> tuple[str, ...]:
    """Stop strings read off `chat`'s rendering of a tool result (empty when it renders none)."""
    msgs = [{"role": "user", "content": "Probe the tool."},
            {"role": "assistant", "content": "", "tool_calls": [_CALL]},
            {"role": "tool", "tool_call_id": "call_probe", "name": "probe_tool", "content": _MARK}]
    try:
        text = chat.render(msgs, tools=[_TOOL], add_generation_prompt=False)
    except ChatTemplateError:
        return ()
    at = text.find(_MARK)
    if at < 0:
        return ()
    specials = tuple(chat.tokenizer.special_tokens)
    before, after = text[:at], text[at + len(_MARK):]
    before = before[max((before.rfind(s) + len(s) for s in specials if s in before), default=0):]
    after = after[:min((after.find(s) for s in specials if s in after), default=len(after))]
    calls = {chat.tool_format.open, chat.tool_format.close} - {""}
    found = [m for part in (before, after) for m in _MARKUP.findall(part)]
    return tuple(dict.fromkeys(m for m in found if m not in calls and m not in specials))


def role_stop_ids(chat: Any) -> tuple[int, ...]:
    """Token ids of the control tokens `chat`'s template writes between two messages (empty when
    it writes none, or cannot render the probe)."""
    marks = [f"\ue000agentrt-message-{i}\ue001" for i in range(3)]
    msgs = [{"role": "user", "content": marks[0]}, {"role": "assistant", "content": marks[1]},
            {"role": "user", "content": marks[2]}]
    try:
        text = chat.render(msgs, add_generation_prompt=False)
    except ChatTemplateError:
        return ()
    at = [text.find(m) for m in marks]
    if min(at) < 0 or at != sorted(at):
        return ()
    between = text[at[0] + len(marks[0]):at[1]] + text[at[1] + len(marks[1]):at[2]]
    specials = chat.tokenizer.special_tokens
    found = re.findall("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)), between) \
        if specials else []
    calls = {chat.tool_format.open, chat.tool_format.close}
    return tuple(dict.fromkeys(specials[s] for s in found if s not in calls and "think" not in s))


__all__ = ["role_stop_ids", "template_stops"]
