"""`/v1/responses`: OpenAI's Responses API on a routed KV session, with `previous_response_id`.

A stored response remembers its tenant, the chain's messages (input and output, without the
instructions) and the key of the session that holds them. A request continuing it resends
nothing: its history is the stored chain, routed to that same session, whose ledger matches it
message for message -- so only the new input is prefilled (`usage.input_tokens_details.
cached_tokens` counts the rest). A chain's first response keys its session by its own id (or the
request's `prompt_cache_key`). Stored responses are bounded by count and TTL and seen only by
the API key that made them: another key's id is a 404, as an unknown one.

Streaming follows OpenAI's event shapes: `response.created`, `response.in_progress`, per output
item `response.output_item.added` / `.done` (text: `response.content_part.added`,
`response.output_text.delta` / `.done`, `response.content_part.done`; a call:
`response.function_call_arguments.delta` / `.done`), then `response.completed` (or
`response.incomplete` when max_output_tokens cut it), each with a `sequence_number`.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from agentrt.conversation.conversation import RoundEnd
from agentrt.conversation.reply import call_id
from agentrt.toolcall import ArgumentsDelta, CallInvalid, CallStarted, TextDelta
from agentrt.toolcall.think import ReasoningDelta

from ..openai import chat
from ..handling import session_key
from ..protocol import ApiError
from .models import ResponsesRequest, chat_request


@dataclass
class Stored:
    tenant: str
    body: dict
    chain: list[dict]  # the chain's messages through this response's output
    session_key: str | None
    expires: float


class ResponseStore:
    """Stored responses: at most `max_count`, each for `ttl_s` seconds, per tenant."""

    def __init__(self, max_count: int, ttl_s: float) -> None:
        self.max_count, self.ttl_s = max_count, ttl_s
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, tenant: str, body: dict, chain: list[dict], session_key: str | None) -> None:
        self._items[body["id"]] = Stored(tenant, body, chain, session_key, time.monotonic() + self.ttl_s)
        while len(self._items) > self.max_count:
            self._items.popitem(last=False)

    def get(self, tenant: str, rid: str) -> Stored:
        """The tenant's stored response, or ApiError 404 (unknown, expired or another key's)."""
        s = self._items.get(rid)
        if s is None or s.tenant != tenant or s.expires < time.monotonic():
            raise ApiError(f"no response {rid!r} is stored for this API key (unknown, expired, deleted, or made "
                           "with store=false)", 404, param="response_id", code="response_not_found")
        return s

    def delete(self, tenant: str, rid: str) -> None:
        self.get(tenant, rid)
        del self._items[rid]

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class ResponseRun:
    """One Responses request resolved: the chat call it runs and what the response reports."""

    req: ResponsesRequest
    call: chat.ChatCall
    chain: list[dict]
    tenant: str
    id: str  # resp_<hex>, named before the call (a chain's first response keys its session by it)
    end: RoundEnd | None = None  # set by finish()
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], end: RoundEnd | None = None) -> dict:
        req = self.req
        out = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.call.model, "output": output, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": req.instructions, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": req.previous_response_id,
            "temperature": req.temperature, "top_p": req.top_p, "max_output_tokens": req.max_output_tokens,
            "tool_choice": req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
            else req.tool_choice.model_dump(), "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "text": {"format": req.format_json() or {"type": "text"}}, "store": req.store, "truncation": "disabled",
            "usage": usage(end) if end is not None else None, "user": req.user}
        if out["tool_choice"] is None:
            out["tool_choice"] = "auto" if req.tools else "none"
        if end is not None and end.invalid:
            out["agentrt"] = {"invalid_tool_calls": [{"name": c.name, "raw": c.raw, "reason": str(c.reason)}
                                                     for c in end.invalid]}
        return out

    def msg_id(self, k: int) -> str:
        return f"msg_{self.id[5:21]}_{k}"

    def output(self, end: RoundEnd) -> list[dict]:
        """The output items of a finished round: a thinking model's reasoning, its text, its calls."""
        items = [self.reasoning_item(end.reasoning, "completed")] if end.reasoning else []
        if text := end.message.get("content"):
            items.append(self.message_item(0, text, "completed"))
        for c in end.message.get("tool_calls") or ():
            items.append(self.call_item(c["id"], c["function"]["name"], c["function"]["arguments"], "completed"))
        return items

    def message_item(self, k: int, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {"type": "message", "id": self.msg_id(k), "status": status, "role": "assistant", "content": content}

    def reasoning_item(self, text: str, status: str) -> dict:
        content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
        return {"type": "reasoning", "id": f"rs_{self.id[5:21]}", "status": status, "summary": [], "content": content}

    @staticmethod
    def call_item(cid: str, name: str, arguments: str, status: str) -> dict:
        return {"type": "function_call", "id": f"fc_{cid}", "call_id": cid, "name": name, "arguments": arguments,
                "status": status}

    def status(self, end: RoundEnd) -> str:
        return "incomplete" if end.finish_reason == "length" else "completed"


def usage(end: RoundEnd) -> dict | None:
    u = end.usage
    if u is None:
        return None
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "agentrt": {"computed_input_tokens": u.computed_prompt_tokens}}


def prepare(req: ResponsesRequest, state, caller: str, salt: str | None) -> ResponseRun:
    """Resolve the request against the store: its history and session key, or 404."""
    store: ResponseStore = state.responses
    history, key = [], None
    if req.previous_response_id is not None:
        prev = store.get(caller, req.previous_response_id)
        history, key = prev.chain, prev.session_key
    creq, chain = chat_request(req, history)
    rid = f"resp_{uuid.uuid4().hex}"
    if key is None and (req.store or req.prompt_cache_key):  # a chain's first response keys its session
        key = session_key(caller, req.prompt_cache_key or f"resp/{rid}", req.cache_salt)
    run = ResponseRun(req, chat.prepare(creq, key, state.config.model_name, salt), chain, caller, rid)
    run.call.reasoning = True  # a thinking model's reasoning is an output item of its own
    return run


def finish(run: ResponseRun, state, end: RoundEnd) -> dict:
    """The completed response body; stored (with the chain through its output) when asked."""
    run.end = end
    body = run.body(run.status(end), run.output(end), end)
    if run.req.store:
        state.responses.put(run.tenant, body, [*run.chain, dict(end.message)], run.call.key)
    return body


class Events:
    """Parser events -> Responses stream events (see the module docstring)."""

    def __init__(self, run: ResponseRun) -> None:
        self.run, self.seq = run, 0
        self.items: list[dict] = []  # output items so far, as streamed
        self.text: dict | None = None  # the open message item
        self.thought: dict | None = None  # the open reasoning item
        self.calls: dict[int, dict] = {}  # parser index -> its function_call item

    def event(self, kind: str, **fields: Any) -> dict:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def start(self) -> list[dict]:
        body = self.run.body("in_progress", [])
        return [self.event("response.created", response=body), self.event("response.in_progress", response=body)]

    def on(self, ev: Any) -> list[dict]:
        if isinstance(ev, ReasoningDelta) and ev.text:
            return self._reason(ev.text)
        if self.thought is not None and isinstance(ev, (TextDelta, CallStarted)):
            return self._close_thought() + self.on(ev)
        if isinstance(ev, TextDelta) and ev.text:
            out = [] if self.text is not None else self._open_text()
            self.text["content"][0]["text"] += ev.text
            return out + [self.event("response.output_text.delta", item_id=self.text["id"],
                                     output_index=self.text["index"], content_index=0, delta=ev.text, logprobs=[])]
        if isinstance(ev, CallStarted):
            out = self._close_text()
            cid = call_id(self.run.call.call_prefix, ev.index)
            item = {**ResponseRun.call_item(cid, ev.name, "", "in_progress"), "index": len(self.items)}
            self.calls[ev.index] = item
            self.items.append(item)
            return out + [self.event("response.output_item.added", output_index=item["index"], item=_bare(item))]
        if isinstance(ev, ArgumentsDelta) and ev.index in self.calls:
            item = self.calls[ev.index]
            item["arguments"] += ev.text
            return [self.event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=item["index"], delta=ev.text)]
        if isinstance(ev, CallInvalid) and ev.index in self.calls:
            item = self.calls.pop(ev.index)
            item["status"] = "incomplete"
            return [self.event("response.output_item.done", output_index=item["index"], item=_bare(item))]
        return []

    def _reason(self, text: str) -> list[dict]:
        out = []
        if self.thought is None:
            self.thought = {**self.run.reasoning_item("", "in_progress"), "index": len(self.items), "text": ""}
            self.items.append(self.thought)
            out.append(self.event("response.output_item.added", output_index=self.thought["index"],
                                  item=_bare(self.thought)))
        self.thought["text"] += text
        return out + [self.event("response.reasoning_text.delta", item_id=self.thought["id"],
                                 output_index=self.thought["index"], content_index=0, delta=text)]

    def _close_thought(self) -> list[dict]:
        t, self.thought = self.thought, None
        if t is None:
            return []
        item = {**self.run.reasoning_item(t["text"], "completed")}
        return [self.event("response.reasoning_text.done", item_id=t["id"], output_index=t["index"], content_index=0,
                           text=t["text"]),
                self.event("response.output_item.done", output_index=t["index"], item=item)]

    def _open_text(self) -> list[dict]:
        k = sum(1 for i in self.items if i["type"] == "message")
        self.text = {**self.run.message_item(k, "", "in_progress"), "index": len(self.items)}
        self.text["content"] = [{"type": "output_text", "text": "", "annotations": []}]
        self.items.append(self.text)
        part = {"type": "output_text", "text": "", "annotations": []}
        added = {**_bare(self.text), "content": []}
        return [self.event("response.output_item.added", output_index=self.text["index"], item=added),
                self.event("response.content_part.added", item_id=self.text["id"], output_index=self.text["index"],
                           content_index=0, part=part)]

    def _close_text(self) -> list[dict]:
        t, self.text = self.text, None
        if t is None:
            return []
        t["status"] = "completed"
        part = t["content"][0]
        return [self.event("response.output_text.done", item_id=t["id"], output_index=t["index"], content_index=0,
                           text=part["text"], logprobs=[]),
                self.event("response.content_part.done", item_id=t["id"], output_index=t["index"], content_index=0,
                           part=part),
                self.event("response.output_item.done", output_index=t["index"], item=_bare(t))]

    def end(self, body: dict) -> list[dict]:
        out = self._close_thought() + self._close_text()
        for item in self.calls.values():
            item["status"] = "completed"
            out += [self.event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=item["index"], arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=item["index"], item=_bare(item))]
        kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return out + [self.event(kind, response=body)]


def _bare(item: dict) -> dict:
    """An item as the client sees it (without the stream's bookkeeping: its index, its text so far)."""
    return {k: v for k, v in item.items() if k not in ("index", "text")}


async def stream(run: ResponseRun, state) -> AsyncIterator[dict]:
    """The request's stream events (an ApiError before the first one when it cannot run)."""
    events, end = Events(run), None
    async with aclosing(chat.run(run.call, state)) as rounds:  # (the session's lock goes with it)
        async for ev in rounds:
            if events.seq == 0:  # the request is accepted once the round runs
                for e in events.start():
                    yield e
            if isinstance(ev, RoundEnd):
                end = ev
            for e in events.on(ev):
                yield e
    if events.seq == 0:
        for e in events.start():
            yield e
    for e in events.end(finish(run, state, end)):
        yield e
