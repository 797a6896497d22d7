"""Runaway tool calls: a round that repeats a call it already made, or makes too many.

Greedy decoding with parallel calls allowed often writes the same correct call again and again
until `max_tokens` (seen on the embedded 135M model under `tool_choice="required"`: 17 identical
calls where one was asked for). `CallLimits` says what ends a round instead:

  * `stop_on_repeat` (default on): the model starting an exact repeat of a call made earlier in
    the round (same name, same arguments) ends the round; the repeat is dropped, and the reply
    kept is the one that ended with the previous call.
  * `max_calls` (default 16, None: no cap): the round ends once that many calls are complete.
    This is the one place the cap is set; the round's `ToolCallParser(max_calls=...)` enforces
    it, stopping at the closing brace of the last allowed call.

`RepeatGuard` sits between the parser and the round's consumers. The events of a call whose
name was already called are held back while its argument text is still a prefix of such a call's
argument text: a call that diverges is released at once (its fragments stream from there on),
and one that completes identical is dropped, so no consumer ever sees a fragment of a call that
is then taken back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrt.checks import check_bool, check_int
from agentrt.toolcall import ArgumentsDelta, CallComplete, CallInvalid, CallStarted


@dataclass(frozen=True)
class CallLimits:
    """What ends a round of tool calls early (see the module docstring)."""

    stop_on_repeat: bool = True
    max_calls: int | None = 16

    def __post_init__(self) -> None:
        check_bool("CallLimits.stop_on_repeat", self.stop_on_repeat)
        if self.max_calls is not None:
            check_int("CallLimits.max_calls (None: no cap)", self.max_calls, min=1)


class RepeatGuard:
    """Parser events in, events for consumers out; `repeat` turns True when a repeat completes."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.repeat = False
        self._done: list[tuple[str, str, dict[str, Any]]] = []  # complete calls: name, argument text, args
        self._name: str | None = None  # the call being written
        self._text = ""  # its argument text so far
        self._held: list[Any] | None = None  # its events, while it may be a repeat

    def push(self, ev: Any) -> list[Any]:
        if not self.enabled:
            return [ev]
        if self.repeat:  # the round ends at the repeat: nothing after it is seen
            return []
        if isinstance(ev, CallStarted):
            self._name, self._text = ev.name, ""
            self._held = [ev] if any(name == ev.name for name, _, _ in self._done) else None
            return [] if self._held is not None else [ev]
        if isinstance(ev, ArgumentsDelta):
            self._text += ev.text
            if self._held is None:
                return [ev]
            self._held.append(ev)
            return [] if self._may_repeat() else self._release()
        if isinstance(ev, CallComplete):
            repeat = self._held is not None and any(
                name == ev.name and args == ev.arguments for name, _, args in self._done)
            self._done.append((ev.name, self._text, ev.arguments))
            if repeat:
                self.repeat, self._held = True, None
                return []
            return self._release() + [ev]
        if isinstance(ev, CallInvalid):
            return self._release() + [ev]
        return [ev]

    def _may_repeat(self) -> bool:
        return any(name == self._name and text.startswith(self._text) for name, text, _ in self._done)

    def _release(self) -> list[Any]:
        held, self._held = self._held or [], None
        return held
