"""OpenAI's `/v1/completions`: a raw prompt (text or token ids) continued by the engine, no chat
template.

Transient requests (the radix cache shares their prefixes); stop strings cut the text and end
the request early; text streams as it decodes. No conversation round: the engine's own stream,
ended by a RoundEnd, through the round runner's `respond` (round_runner.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from fastapi.responses import Response

from agentrt.conversation.conversation import RoundEnd
from agentrt.engine.context_length import context_overflow
from agentrt.engine.validate import check_prompt
from agentrt.errors import ConfigError
from agentrt.model.tokenizer import IncrementalDecoder

from ..handling import Exchange, tenant_salt
from ..protocol import ApiError, SamplingRequest, parse
from ..round_runner import Body, respond


class CompletionRequest(SamplingRequest):
    prompt: str | list[int]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.echo or self.suffix or (self.best_of or 1) != 1:
            raise ApiError("echo, suffix and best_of are not supported", param="prompt")


async def create(ex: Exchange) -> Response:
    """parse -> prepare (TextRun) -> run -> render."""
    req = parse(CompletionRequest, ex.body)
    run = TextRun(req, ex.state, ex.state.config.served_model(req.model), tenant_salt(ex.caller, req.cache_salt))
    renderer = TextChunks(run) if req.stream else Body(run.final_body)
    return await respond(ex, run.events(), renderer, stream=req.stream)


class TextRun:
    """One completion: its prompt ids, params and the text produced so far."""

    def __init__(self, req: CompletionRequest, state, model: str, salt: str | None = None) -> None:
        tok, engine = state.engine.tokenizer, state.engine
        prompt = tok.encode(req.prompt) if isinstance(req.prompt, str) else list(req.prompt)
        try:
            prompt = check_prompt(prompt, engine.model.cfg.vocab_size)
        except ConfigError as e:
            raise ApiError(str(e), param="prompt") from None
        limit = engine.max_context_tokens
        max_tokens = req.max_tokens or min(16, limit - len(prompt))  # OpenAI's default for completions
        if max_tokens > state.config.max_tokens_limit:
            raise ApiError(f"max_tokens {max_tokens} is over this server's limit ({state.config.max_tokens_limit})",
                           param="max_tokens")
        if (overflow := context_overflow(len(prompt), max_tokens, limit)) is not None:
            raise ApiError(str(overflow), code="context_length_exceeded", param="prompt")
        self.req, self.engine, self.prompt, self.model, self.salt = req, engine, prompt, model, salt
        self.params = req.sampling(max_tokens)
        adapter = state.config.adapter_of(model)  # (a LoRA served as a model of its own)
        self.extra = {} if adapter is None else {"adapter": adapter}
        self.id, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.text, self.usage, self.stopped = "", None, False
        self.ids: list[int] = []  # the generated token ids
        self.finish: str | None = None  # "stop" or "length" once the engine's last event came

    async def events(self) -> AsyncGenerator[Any, None]:
        """The run as the round runner takes it: "" first (the prompt passed the checks, so a
        stream's first chunk goes out before the engine admits it), the pieces, then a RoundEnd."""
        yield ""
        async for piece in self.pieces():
            yield piece
        yield RoundEnd(self.text, [], [], list(self.ids), self.usage, self.finish, self.stopped)

    async def pieces(self) -> AsyncGenerator[str, None]:
        """New text as it decodes (cut before a stop string); sets finish and usage at the end."""
        dec = IncrementalDecoder(self.engine.tokenizer)
        async with aclosing(self.engine.generate(self.prompt, self.params, cache_salt=self.salt, **self.extra)) as events:
            async for ev in events:
                piece = "" if self.stopped else "".join(dec.push(t) for t in ev.token_ids)
                self.ids += [] if self.stopped else list(ev.token_ids)
                if ev.finish_reason is not None:
                    piece += "" if self.stopped else dec.flush()
                    self.usage = ev.usage
                    self.finish = "stop" if self.stopped or ev.finish_reason != "length" else "length"
                piece, hit = self._cut(piece) if not self.stopped else ("", False)
                if hit and not self.stopped:
                    self.stopped = True
                    self.engine.stop(ev.request_id)
                if piece:
                    self.text += piece
                    yield piece

    def _cut(self, piece: str) -> tuple[str, bool]:
        joined = self.text + piece
        hits = [i for s in self.req.stop if (i := joined.find(s, max(0, len(self.text) - len(s) + 1))) >= 0]
        if not hits:
            return piece, False
        return joined[len(self.text):min(hits)] if min(hits) >= len(self.text) else "", True

    def _usage(self) -> dict | None:
        u = self.usage
        return None if u is None else {
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens}}

    def body(self, text: str, finish: str | None, final: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        if final and self.req.return_token_ids:
            choice["token_ids"] = list(self.ids)
        out = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
               "choices": [choice]}
        if final and not self.req.stream:
            out["usage"] = self._usage()
        return out

    def final_body(self, end: RoundEnd) -> dict[str, Any]:
        """The non-streaming response body (the Body renderer's)."""
        return self.body(self.text, self.finish, final=True)

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [], "usage": self._usage()}


class TextChunks:
    """The streaming Renderer: an empty first chunk, one per piece of text, the finish reason
    (then the usage when `stream_options.include_usage` is set)."""

    def __init__(self, run: TextRun) -> None:
        self.run = run

    def first(self) -> list[dict]:
        return [self.run.body("", None, final=False)]

    def event(self, piece: str) -> list[dict]:
        return [self.run.body(piece, None, final=False)] if piece else []

    def last(self, end: RoundEnd) -> list[dict]:
        out = [self.run.body("", self.run.finish, final=True)]
        return out + [self.run.usage_chunk()] if self.run.req.include_usage else out
