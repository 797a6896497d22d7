"""The Responses API's stream: a run's parser events as Responses events (`Events`, the streaming
Renderer of round_runner.py).

Streaming follows OpenAI's event shapes: `response.created`, `response.in_progress`, per output
item `response.output_item.added` / `.done` (text: `response.content_part.added`,
`response.output_text.delta` / `.done`, `response.content_part.done`; a call:
`response.function_call_arguments.delta` / `.done`), then `response.completed` (or
`response.incomplete` when max_output_tokens cut it), each with a `sequence_number`.
"""

from __future__ import annotations

from typing import Any

from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta
from agentrt.toolcall.think import ReasoningDelta

from .run import ResponseRun, finish


class Events:
    """The streaming Renderer: parser events -> Responses stream events (see the module docstring)."""

    def __init__(self, run: ResponseRun, state) -> None:
        self.run, self.state, self.seq = run, state, 0
        self.items: list[dict] = []  # output items so far, as streamed
        self.text: dict | None = None  # the open message item
        self.thought: dict | None = None  # the open reasoning item
        self.calls: dict[int, dict] = {}  # parser index -> its function_call item

    def emit(self, kind: str, **fields: Any) -> dict:
        """One stream event, numbered."""
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def first(self) -> list[dict]:
        body = self.run.body("in_progress", [])
        return [self.emit("response.created", response=body), self.emit("response.in_progress", response=body)]

    def event(self, ev: Any) -> list[dict]:
        if isinstance(ev, ReasoningDelta) and ev.text:
            return self._reason(ev.text)
        if self.thought is not None and isinstance(ev, (TextDelta, CallStarted)):
            return self._close_thought() + self.event(ev)
        if isinstance(ev, TextDelta) and ev.text:
            text, out = (self.text, []) if self.text is not None else self._open_text()
            text["content"][0]["text"] += ev.text
            return out + [self.emit("response.output_text.delta", item_id=text["id"],
                                    output_index=text["index"], content_index=0, delta=ev.text, logprobs=[])]
        if isinstance(ev, CallStarted):
            out = self._close_text()
            cid = call_id(self.run.call.call_prefix, ev.index)
            item = {**ResponseRun.call_item(cid, ev.name, "", "in_progress"), "index": len(self.items)}
            self.calls[ev.index] = item
            self.items.append(item)
            return out + [self.emit("response.output_item.added", output_index=item["index"], item=_bare(item))]
        if isinstance(ev, ArgumentsDelta) and ev.index in self.calls:
            item = self.calls[ev.index]
            item["arguments"] += ev.text
            return [self.emit("response.function_call_arguments.delta", item_id=item["id"],
                              output_index=item["index"], delta=ev.text)]
        if isinstance(ev, CallInvalid) and ev.index in self.calls:
            item = self.calls.pop(ev.index)
            item["status"] = "incomplete"
            return [self.emit("response.output_item.done", output_index=item["index"], item=_bare(item))]
        return []

    def _reason(self, text: str) -> list[dict]:
        out = []
        if self.thought is None:
            self.thought = {**self.run.reasoning_item("", "in_progress"), "index": len(self.items), "text": ""}
            self.items.append(self.thought)
            out.append(self.emit("response.output_item.added", output_index=self.thought["index"],
                                 item=_bare(self.thought)))
        self.thought["text"] += text
        return out + [self.emit("response.reasoning_text.delta", item_id=self.thought["id"],
                                output_index=self.thought["index"], content_index=0, delta=text)]

    def _close_thought(self) -> list[dict]:
        t, self.thought = self.thought, None
        if t is None:
            return []
        item = {**self.run.reasoning_item(t["text"], "completed")}
        return [self.emit("response.reasoning_text.done", item_id=t["id"], output_index=t["index"], content_index=0,
                          text=t["text"]),
                self.emit("response.output_item.done", output_index=t["index"], item=item)]

    def _open_text(self) -> tuple[dict, list[dict]]:
        """(the new open message item, the events opening it)."""
        k = sum(1 for i in self.items if i["type"] == "message")
        self.text = t = {**self.run.message_item(k, "", "in_progress"), "index": len(self.items)}
        t["content"] = [{"type": "output_text", "text": "", "annotations": []}]
        self.items.append(t)
        part = {"type": "output_text", "text": "", "annotations": []}
        added = {**_bare(t), "content": []}
        return t, [self.emit("response.output_item.added", output_index=t["index"], item=added),
                   self.emit("response.content_part.added", item_id=t["id"], output_index=t["index"],
                             content_index=0, part=part)]

    def _close_text(self) -> list[dict]:
        t, self.text = self.text, None
        if t is None:
            return []
        t["status"] = "completed"
        part = t["content"][0]
        return [self.emit("response.output_text.done", item_id=t["id"], output_index=t["index"], content_index=0,
                          text=part["text"], logprobs=[]),
                self.emit("response.content_part.done", item_id=t["id"], output_index=t["index"], content_index=0,
                          part=part),
                self.emit("response.output_item.done", output_index=t["index"], item=_bare(t))]

    def last(self, end: RoundEnd) -> list[dict]:
        body = finish(self.run, self.state, end)
        out = self._close_thought() + self._close_text()
        for item in self.calls.values():
            item["status"] = "completed"
            out += [self.emit("response.function_call_arguments.done", item_id=item["id"],
                              output_index=item["index"], arguments=item["arguments"]),
                    self.emit("response.output_item.done", output_index=item["index"], item=_bare(item))]
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return out + [self.emit(kind, response=body)]


def _bare(item: dict) -> dict:
    """An item as the client sees it (without the stream's bookkeeping: its index, its text so far)."""
    return {k: v for k, v in item.items() if k not in ("index", "text")}
