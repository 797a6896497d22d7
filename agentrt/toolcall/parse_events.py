"""Events and states of the streaming tool-call parser.

Every event is a frozen dataclass; `ToolCallParser.feed()` / `close()` return lists of them in
stream order. Invariants a consumer may rely on, for any way the input is split into pieces:

* the concatenated `TextDelta.text` is the same;
* per call index, `CallStarted` (if any) comes before every `ArgumentsDelta` of that index, and
  exactly one verdict (`CallComplete` or `CallInvalid`) ends the call;
* for a `CallComplete`, the concatenated `ArgumentsDelta.text` of its index is JSON text that
  parses to `arguments` (the raw object text, or the decoded string when the model sent the
  arguments as a JSON string, or "{}" when it sent none);
* `EarlyStop` is emitted at most once, as the last event before the parser ignores its input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Union


class InvalidKind(enum.StrEnum):
    """Why a call was rejected (`CallInvalid.kind`)."""

    UNKNOWN_TOOL = "unknown_tool"  # the name is not a declared tool (reported when it closes)
    MALFORMED_JSON = "malformed_json"  # the text is not JSON (strict RFC 8259, as json.loads)
    BAD_CALL = "bad_call"  # a list element that is not an object, or a duplicated call key
    MISSING_NAME = "missing_name"  # no "name" key, or its value is not a string
    BAD_ARGUMENTS = "bad_arguments"  # arguments not an object (nor a string holding one)
    SCHEMA_VIOLATION = "schema_violation"  # arguments fail the tool's JSON schema
    INCOMPLETE = "incomplete"  # the stream ended inside the call


class ParserState(enum.StrEnum):
    """Where the parser is in the message (`ToolCallParser.state`)."""

    MESSAGE_START = "message_start"  # json/auto: only whitespace so far, format undecided
    TEXT = "text"  # ordinary assistant text
    IN_CALL = "in_call"  # inside a <tool_call> tag or a bare JSON call container
    CLOSING_TAG = "closing_tag"  # call JSON done, waiting for </tool_call>
    SKIPPING = "skipping"  # malformed tag content: skipping to </tool_call>
    BETWEEN_CALLS = "between_calls"  # after a call: another call or the stop point follows
    FENCE_OPEN = "fence_open"  # "```json" at message start: a fenced call may follow (held)
    FENCE_CLOSE = "fence_close"  # a fenced call's JSON done, waiting for "```"
    STOPPED = "stopped"  # should_stop is set; further input is ignored
    CLOSED = "closed"  # close() was called


@dataclass(frozen=True)
class TextDelta:
    """Assistant text outside tool calls (never a possible prefix of a <tool_call> tag)."""

    text: str


@dataclass(frozen=True)
class CallStarted:
    """The call's name string closed and names a declared tool."""

    index: int
    name: str


@dataclass(frozen=True)
class ArgumentsDelta:
    """More JSON text of call `index`'s arguments object (see the module invariants)."""

    index: int
    text: str


@dataclass(frozen=True)
class CallComplete:
    """The call object closed; `arguments` parsed and satisfy the tool's schema.

    `raw` is the call object's JSON text exactly as the model wrote it.
    """

    index: int
    name: str
    arguments: dict[str, Any]
    raw: str


@dataclass(frozen=True)
class CallInvalid:
    """Call `index` was rejected; `reason` says why (schema errors include the JSON path).

    `raw` is the call's text from its first character through the character where the
    problem was found (the whole object for schema and argument errors). `name` is the
    tool name when it was read as a string, else None.
    """

    index: int
    reason: str
    raw: str
    name: str | None
    kind: InvalidKind


@dataclass(frozen=True)
class EarlyStop:
    """No more useful output can follow; the engine may stop decoding here."""

    reason: str


Event = Union[TextDelta, CallStarted, ArgumentsDelta, CallComplete, CallInvalid, EarlyStop]
Verdict = Union[CallComplete, CallInvalid]


class EventSink:
    """Collects the events of one feed()/close(), merging adjacent text / argument deltas.

    Merging keeps pieces in a list and joins once at flush, so a piece stream costs linear
    time however finely it is split.
    """

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._parts: list[str] = []
        self._delta_index: int | None = None  # None: pending parts are text; else args index

    def text(self, piece: str) -> None:
        if piece:
            if self._parts and self._delta_index is not None:
                self._flush()
            self._parts.append(piece)

    def args(self, index: int, piece: str) -> None:
        if piece:
            if self._parts and self._delta_index != index:
                self._flush()
            self._delta_index = index
            self._parts.append(piece)

    def emit(self, event: Event) -> None:
        self._flush()
        self._events.append(event)

    def take(self) -> list[Event]:
        self._flush()
        events, self._events = self._events, []
        return events

    def _flush(self) -> None:
        parts = self._parts
        if parts:
            text = parts[0] if len(parts) == 1 else "".join(parts)
            if self._delta_index is None:
                self._events.append(TextDelta(text))
            else:
                self._events.append(ArgumentsDelta(self._delta_index, text))
            parts.clear()
        self._delta_index = None
