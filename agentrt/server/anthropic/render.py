"""Anthropic's Messages API rendered: a finished round as a `message` (`message`), and a run's
parser events as its stream (`Events`): `message_start`, per content block
`content_block_start` / `_delta` (`text_delta`, or `input_json_delta` fragments of a tool
call's input as the validator passes them) / `_stop`, then `message_delta` (stop reason and the
final usage) and `message_stop`."""

from __future__ import annotations

from typing import Any

from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta

from ..round_runner import ChatCall
from . import models as api


def message(req: api.MessagesRequest, call: ChatCall, mid: str, state, end: RoundEnd) -> dict:
    """The `message` of a finished round (the non-streaming body)."""
    reason, seq = api.stop_reason(end, req.stop_sequences, state.engine.tokenizer.decode(end.generated))
    return {"id": mid, "type": "message", "role": "assistant", "model": call.model, "content": api.content(end),
            "stop_reason": reason, "stop_sequence": seq, "usage": api.usage(end)}


class Events:
    """The streaming Renderer: parser events -> Messages stream events."""

    def __init__(self, req: api.MessagesRequest, call: ChatCall, mid: str, state) -> None:
        self.req, self.call, self.mid, self.state = req, call, mid, state
        self.blocks: dict = {}  # ("text", n) or ("call", parser index) -> content block index
        self.open_text: int | None = None

    def first(self) -> list[dict]:
        return [{"type": "message_start", "message": {
            "id": self.mid, "type": "message", "role": "assistant", "model": self.call.model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}}]

    def event(self, ev: Any) -> list[dict]:
        if isinstance(ev, TextDelta) and ev.text:
            return self._text(ev.text)
        if isinstance(ev, CallStarted):
            i = self.blocks[("call", ev.index)] = len(self.blocks)
            block = {"type": "tool_use", "id": call_id(self.call.call_prefix, ev.index), "name": ev.name, "input": {}}
            return self._close_text() + [{"type": "content_block_start", "index": i, "content_block": block}]
        if isinstance(ev, ArgumentsDelta) and ("call", ev.index) in self.blocks:
            return [{"type": "content_block_delta", "index": self.blocks[("call", ev.index)],
                     "delta": {"type": "input_json_delta", "partial_json": ev.text}}]
        if isinstance(ev, CallInvalid):
            self.blocks.pop(("call", ev.index), None)
        return []

    def _text(self, text: str) -> list[dict]:
        out = []
        if self.open_text is None:
            self.open_text = self.blocks[("text", len(self.blocks))] = len(self.blocks)
            out.append({"type": "content_block_start", "index": self.open_text,
                        "content_block": {"type": "text", "text": ""}})
        return out + [{"type": "content_block_delta", "index": self.open_text,
                       "delta": {"type": "text_delta", "text": text}}]

    def _close_text(self) -> list[dict]:
        i, self.open_text = self.open_text, None
        return [] if i is None else [{"type": "content_block_stop", "index": i}]

    def last(self, end: RoundEnd) -> list[dict]:
        out = [{"type": "content_block_stop", "index": i} for k, i in sorted(self.blocks.items(), key=lambda kv: kv[1])
               if k[0] == "call" or i == self.open_text]
        msg = message(self.req, self.call, self.mid, self.state, end)
        return out + [{"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"],
                                                           "stop_sequence": msg["stop_sequence"]},
                       "usage": msg["usage"]},
                      {"type": "message_stop"}]
