"""Server-sent events and client disconnects.

A request's work runs in the handler's own task (a session's lock is held by the task that took
it), beside a child task that waits for `http.disconnect` and cancels the work when it comes:
a client that goes away mid-request or mid-stream frees its engine request and session at once,
not at the next token write.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send


async def _watch(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


async def until_disconnect(request: Request, work: Callable[[], Awaitable[Any]]) -> Any:
    """work()'s result, or None when the client disconnected first (work is cancelled)."""
    result = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch, request.receive, tg.cancel_scope)
            try:
                result = await work()
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # the work's own error, as it was raised
        raise _single(group) from None
    return result


def _single(group: BaseExceptionGroup) -> BaseException:
    """The one error inside nested groups of one (else the innermost group of several)."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


class EventStream(Response):
    """A response streaming dicts as `data: <json>` events, then `data: [DONE]` (chat and
    completions). `named`: each event also carries `event: <its "type">` and no [DONE] follows
    (the Responses and Messages APIs)."""

    def __init__(self, first: dict, rest: AsyncGenerator[dict, None], named: bool = False) -> None:
        super().__init__(status_code=200, media_type="text/event-stream")
        self.first, self.rest, self.named = first, rest, named

    @classmethod
    async def start(cls, items: AsyncGenerator[dict, None], named: bool = False) -> "EventStream":
        """The stream, once its first item exists: an error raised before it (bad input, a
        limit) propagates here, so the caller answers it as a plain error response."""
        try:
            first = await items.__anext__()
        except BaseException:
            await items.aclose()
            raise
        return cls(first, items, named)

    def _event(self, item: dict) -> bytes:
        data = f"data: {json.dumps(item, ensure_ascii=False)}\n\n"
        return (f"event: {item['type']}\n" + data if self.named else data).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(receive, send)
        except BaseExceptionGroup as group:
            raise _single(group) from None

    async def _stream(self, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch, receive, tg.cancel_scope)
            try:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                        (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
                await send({"type": "http.response.body", "body": self._event(self.first), "more_body": True})
                async for item in self.rest:
                    await send({"type": "http.response.body", "body": self._event(item), "more_body": True})
                done = b"" if self.named else b"data: [DONE]\n\n"
                await send({"type": "http.response.body", "body": done, "more_body": False})
            except OSError:
                pass  # the client went away between the disconnect message and a write
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await self.rest.aclose()
