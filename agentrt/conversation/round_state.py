"""One round's streaming state (`Conversation.round`): decoded pieces through the think splitter,
the call parser (or `TextOnly` where no call can be made), the repeat guard and the stop strings,
into the events the round yields and the text, calls and ids it keeps."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrt.conversation.repeats import RepeatGuard
from agentrt.records.request import Usage
from agentrt.toolcall import CallComplete, CallInvalid, TextDelta
from agentrt.toolcall.parse_events import InvalidKind
from agentrt.toolcall.think import ReasoningDelta, ThinkSplitter


class TextOnly:
    """The parser's interface where no tool call can be made: every piece is text."""

    should_stop = False

    def feed(self, text: str) -> list:
        return [TextDelta(text)] if text else []

    def close(self) -> list:
        return []


class RoundState:
    """Mutable state of one round: parser, stop strings, what was seen."""

    def __init__(self, parser: Any, stop: tuple[str, ...], reasoning: bool, stop_on_repeat: bool,
                 markers: tuple[str, ...] = ()) -> None:
        """`markers`: the template's own (conversation/template_stops.py), also in `stop`: one
        the reply begins with is dropped (a small model restating a tool result writes its
        wrapper first), anywhere later it ends the reply."""
        self.parser, self.stop, self.reasoning, self.markers = parser, stop, reasoning, markers
        self.guard = RepeatGuard(stop_on_repeat)
        self.mark = (0, 0)  # (ids, pieces) fed when the last kept call completed
        self.think = ThinkSplitter()
        self.constrained = False  # a grammar shaped the output without fast-forward (respelled)
        self.thoughts: list[str] = []
        self.raw: list[str] = []  # every decoded piece fed
        self.text: list[str] = []
        self.calls: list[CallComplete] = []
        self.invalid: list[CallInvalid] = []
        self.generated: list[int] = []
        self.usage: Usage | None = None  # the engine's, from the final event
        self.finish: str | None = None  # the engine's finish reason (then early_stop where the parser stopped it)
        self.stopped = False
        self._held = ""  # text that may be the start of a stop string: emitted once it is not
        self._said = False  # some non-whitespace text went out (a marker then ends the reply)

    def feed(self, piece: str, closing: bool = False) -> list:
        out: list = []
        events = []
        self.raw.append(piece)
        for kind, text in self.think.feed(piece) + (self.think.close() if closing else []):
            if kind == "reasoning":
                self.thoughts.append(text)
                out += [ReasoningDelta(text)] if self.reasoning else []
            else:
                events += self.parser.feed(text)
        events += self.parser.close() if closing else []
        events = [out_ev for ev in events for out_ev in self.guard.push(ev)]
        if self.guard.repeat and not self.stopped:  # the reply ends with the previous call
            del self.generated[self.mark[0]:], self.raw[self.mark[1]:]
            self.stopped = True
        for ev in events:
            if isinstance(ev, TextDelta):
                self._emit_text(self._cut_at_stop(ev.text), out)
                if self.stopped:
                    break
                continue
            self._emit_text(self._release(), out)  # (text held before a call was not a stop string)
            if isinstance(ev, CallComplete):
                self.calls.append(ev)
                self.mark = (len(self.generated), len(self.raw))
            elif isinstance(ev, CallInvalid):
                ev = self._hinted(ev)
                self.invalid.append(ev)
            out.append(ev)
        self.stopped = self.stopped or self.parser.should_stop
        if closing and not self.stopped:  # (the reply's last text, held as a possible stop's start)
            self._emit_text(self._release(), out)
        return out

    def _hinted(self, ev: CallInvalid) -> CallInvalid:
        """A call cut short by max_tokens says so, and what to do."""
        if ev.kind is not InvalidKind.INCOMPLETE or self.finish != "length":
            return ev
        return replace(ev, reason=f"{ev.reason}: max_tokens ran out ({len(self.generated)} tokens); "
                                  "raise max_tokens to leave room for the call's name and arguments")

    def _emit_text(self, text: str, out: list) -> None:
        if text:
            self.text.append(text)
            self._said = self._said or not text.isspace()
            out.append(TextDelta(text))

    def _drop_leading_markers(self, text: str) -> str:
        while True:
            head = text.lstrip()
            m = next((m for m in self.markers if head.startswith(m)), None)
            if m is None:
                return text
            text = head[len(m):].lstrip()

    def _release(self) -> str:
        held, self._held = self._held, ""
        return held

    def _cut_at_stop(self, piece: str) -> str:
        """The text of `piece` that can go out now: cut before the first stop string (then
        stopped); a tail that may begin a stop string is held until the next piece decides it, so
        no part of a stop string ever reaches the reply."""
        if not self.stop:
            return piece
        joined = self._release() + piece
        if self.markers and not self._said:
            joined = self._drop_leading_markers(joined)
        hits = [i for s in self.stop if (i := joined.find(s)) >= 0]
        if hits:
            self.stopped = True
            return joined[:min(hits)]
        keep = max((k for s in self.stop for k in range(1, len(s)) if joined.endswith(s[:k])), default=0)
        self._held = joined[len(joined) - keep:] if keep else ""
        return joined[:len(joined) - keep]
