"""The ```json fence states of ToolCallParser (a call fenced at the start of a message)."""

from __future__ import annotations

from agentrt.toolcall.parse_events import ParserState
from agentrt.toolcall.tags import match_literal

_FENCE = "```"


class FenceStates:
    """Mixin: handlers for ParserState.FENCE_OPEN / FENCE_CLOSE (uses the parser's fields)."""

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
            i = self._skip_ws(s, i)
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

