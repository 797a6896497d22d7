"""The ```json fence states of ToolCallParser (a call fenced at the start of a message)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from agentrt.toolcall.parse_events import EventSink, ParserState
from agentrt.toolcall.tags import match_literal, skip_ws

_FENCE = "```"


class FenceStates(ABC):
    """Handlers for ParserState.FENCE_OPEN / FENCE_CLOSE, a base of ToolCallParser.

    The parser owns the fields and hooks declared here (set in its __init__); declaring them
    states what the fence states read and write.
    """

    _matched: int  # characters of the literal being matched (``` here) but not yet decided
    _fence: list[str]  # held fence text while undecided
    _held_ws: list[str]  # leading whitespace while the format is undecided
    _fenced: bool  # the current bare call sits in a fence
    _verdicts: int  # calls ended so far
    _out: EventSink

    @abstractmethod
    def _open_container(self, *, bare: bool) -> None: ...

    @abstractmethod
    def _enter(self, state: ParserState) -> None: ...

    @abstractmethod
    def _stop(self, end: int, reason: str) -> None: ...

    def _on_fence_open(self, s: str, i: int) -> int:
        """```, an optional language word, whitespace, then '{' or '[' opens a fenced call."""
        ch = s[i]
        if self._matched < len(_FENCE):
            matched, j = match_literal(_FENCE, self._matched, s, i)
            self._fence.append(s[i:j])
            self._matched = matched
            return j if matched == len(_FENCE) or j == len(s) else self._not_a_fence(s, j)
        if ch.isalpha() and not any(c.isspace() for c in self._fence[-1:]):
            self._fence.append(ch)
            return i + 1
        if ch in " \t\r\n":
            self._fence.append(ch)
            return i + 1
        if ch in "{[":
            self._held_ws, self._fence, self._matched, self._fenced = [], [], 0, True
            self._open_container(bare=True)
            return i
        return self._not_a_fence(s, i)

    def _not_a_fence(self, s: str, i: int) -> int:
        if self._verdicts:  # after calls: anything else ends the message
            self._stop(i + 1, "text after the tool calls")
            return i
        self._out.text("".join(self._held_ws + self._fence))
        self._held_ws, self._fence, self._matched = [], [], 0
        self._enter(ParserState.TEXT)
        return i  # s[i] is examined again as text

    def _on_fence_close(self, s: str, i: int) -> int:
        if self._matched == 0:
            i = skip_ws(s, i)
            if i == len(s):
                return i
        matched, j = match_literal(_FENCE, self._matched, s, i)
        if matched == len(_FENCE):
            self._matched, self._fenced = 0, False
            self._enter(ParserState.BETWEEN_CALLS)
        elif j == len(s):
            self._matched = matched
        else:
            self._stop(j + 1, "text after the fenced tool call")
        return j

