"""`/v1/responses`: OpenAI's Responses API on a routed KV session, with `previous_response_id`:
a request resolved against the stored responses (`prepare`), and its response object (`ResponseRun`).

A stored response remembers its tenant, the chain's messages (input and output, without the
instructions) and the key of the session that holds them. A request continuing it resends
nothing: its history is the stored chain, routed to that same session, whose ledger matches it
message for message -- so only the new input is prefilled (`usage.input_tokens_details.
cached_tokens` counts the rest). A chain's first response keys its session by its own id (or the
request's `prompt_cache_key`). Stored responses are bounded by count and TTL and seen only by
the API key that made them: another key's id is a 404, as an unknown one.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from agentrt.conversation.conversation import RoundEnd

from ..handling import session_key
from ..round_runner import ChatCall
from ..round_runner import prepare as prepare_call
from .models import ResponsesRequest, chat_request
from .store import ResponseStore


@dataclass
class ResponseRun:
    """One Responses request resolved: the chat call it runs and what the response reports."""

    req: ResponsesRequest
    call: ChatCall
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
    run = ResponseRun(req, prepare_call(creq, key, state.config.served_model(req.model), salt), chain, caller, rid)
    run.call.reasoning = True  # a thinking model's reasoning is an output item of its own
    return run


def finish(run: ResponseRun, state, end: RoundEnd) -> dict:
    """The completed response body; stored (with the chain through its output) when asked."""
    run.end = end
    body = run.body(run.status(end), run.output(end), end)
    if run.req.store:
        state.responses.put(run.tenant, body, [*run.chain, dict(end.message)], run.call.key)
    return body
