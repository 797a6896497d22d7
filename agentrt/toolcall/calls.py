"""Tool calls inside one JSON container: the content of a <tool_call> tag, or a bare JSON value.

The container is either one call object or a list of them. Each list element (or the single
root value) is a *slot* with its own call index; a slot gets exactly one verdict:

  * CallInvalid(UNKNOWN_TOOL) the moment its name string closes, if the name is not declared;
  * CallInvalid(MALFORMED_JSON) at the first character that cannot continue the JSON;
  * otherwise, when the slot's value closes: BAD_CALL / MISSING_NAME / BAD_ARGUMENTS /
    SCHEMA_VIOLATION, or CallComplete;
  * CallInvalid(INCOMPLETE) from close() if the stream ended inside it.

The scanner only reports the container, its elements and the members of call objects
(`watch_depth`), so argument contents are validated without per-token Python work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from agentrt.toolcall.parse_events import CallComplete, CallInvalid, CallStarted, EventSink, InvalidKind, Verdict
from agentrt.toolcall.scanner import END, PIECE, START, JsonScanner
from agentrt.toolcall.specs import ToolSpec

_ARGS_KEYS = ("arguments", "parameters")  # "parameters" is an accepted alias
_KEY, _NAME, _ARGS_STRING, _ARGS_RAW = "key", "name", "args_string", "args_raw"
_TYPE_NAMES = MappingProxyType(
    {"{": "an object", "[": "a list", '"': "a string", "0": "a number", "t": "a literal"}
)


class _Slot:
    """Mutable state of one call (one list element or the single root value)."""

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind  # scanner START kind of the element; '{' for a call object
        self.role: str | None = None  # which watched member value is being read
        self.parts: list[str] = []  # decoded text of the key / name string being read
        self.key: str | None = None  # the key whose value comes next (None: ignore it)
        self.seen: set[str] = set()  # call keys met so far, for duplicate detection
        self.duplicate: str | None = None
        self.name: str | None = None
        self.name_not_string = False
        self.args_key: str | None = None
        self.started = False  # CallStarted emitted: argument text streams directly
        self.pending: list[str] = []  # argument text seen before the name was known
        self.settled = False  # a verdict was emitted; the rest of the slot is only skipped


class CallContainer:
    """Feeds one JSON container through a JsonScanner and emits the call events it implies."""

    def __init__(self, specs: Mapping[str, ToolSpec], out: EventSink, first_index: int) -> None:
        self._specs = specs
        self._out = out
        self._scanner = JsonScanner(watch_depth=0)
        self.next_index = first_index  # index the next slot will take
        self.is_list = False  # the root value is a list of calls
        self.root_started = False
        self.token = False  # the last step() handled a token
        self.verdict: Verdict | None = None  # the verdict emitted by the last token, if any
        self.trigger_end = 0  # index just past the character that produced the last token
        self._call_depth = 0  # depth of call objects: 0 (root object) or 1 (list elements)
        self._slot: _Slot | None = None
        self._rec: list[str] = []  # text of the open slot, or loose text since the last slot

    @property
    def done(self) -> bool:
        return self._scanner.done

    @property
    def failed(self) -> bool:
        return self._scanner.failed

    @property
    def steps(self) -> int:
        return self._scanner.steps

    def step(self, s: str, i: int, base: int) -> int:
        """Consume s[i:] up to the next token; return where to continue. `base`: offset of s[0].

        `token` tells whether a token was handled; only then may `verdict`, `done` or `failed`
        have changed (the root's end and errors are always tokens).
        """
        j, tok = self._scanner.scan(s, i)
        if j > i:
            text = s[i:j]
            self._rec.append(text)
            slot = self._slot
            if slot is not None and slot.role is _ARGS_RAW:
                if slot.started and not slot.settled:  # the common case, inlined
                    self._out.args(slot.index, text)
                else:
                    self._args_text(slot, text)
        if tok is None:
            self.token = False
            return j
        self.token, self.verdict, self.trigger_end = True, None, j
        kind, depth, data = tok
        if kind is START:
            self._start(depth, data, s, j)
        elif kind is PIECE:
            self._piece(data)
        elif kind is END:
            self._end(depth, data)
        else:
            self._error(data, s, j, base)
        return j

    def close(self) -> None:
        """End of stream: a slot without a verdict, or a tag with no JSON yet, is INCOMPLETE."""
        slot = self._slot
        if slot is not None and not slot.settled:
            self._invalid(slot, InvalidKind.INCOMPLETE, "the stream ended inside the tool call",
                          "".join(self._rec))
        elif not self.root_started and not self.failed:
            index = self._take_index()
            self._emit(CallInvalid(index, "the stream ended inside the tool call", "", None,
                                   InvalidKind.INCOMPLETE))

    # -- tokens --------------------------------------------------------------------------------

    def _start(self, depth: int, kind: str, s: str, j: int) -> None:
        if depth == 0:
            self.root_started = True
            if kind == "[":
                self.is_list, self._call_depth = True, 1
                self._scanner.watch_depth = 1
            else:
                self._open_slot(kind, s, j)
        elif depth == self._call_depth:
            self._open_slot(kind, s, j)
        elif self._slot is not None and not self._slot.settled:
            self._member_start(self._slot, kind, s, j)

    def _open_slot(self, kind: str, s: str, j: int) -> None:
        self._slot = _Slot(self._take_index(), kind)
        self._rec = [s[j - 1]]
        # Watch the members of call objects; never look inside other elements.
        self._scanner.watch_depth = self._call_depth + (1 if kind == "{" else 0)

    def _member_start(self, slot: _Slot, kind: str, s: str, j: int) -> None:
        if kind == "k":
            slot.role, slot.parts = _KEY, []
            self._scanner.decode = True
            return
        key, slot.key = slot.key, None
        if key == "name":
            if kind == '"':
                slot.role, slot.parts = _NAME, []
                self._scanner.decode = True
            else:
                slot.name_not_string = True
        elif key in _ARGS_KEYS:
            slot.args_key = key
            if kind == '"':  # arguments sent as a JSON string: stream its decoded text
                slot.role = _ARGS_STRING
                self._scanner.decode = True
            else:
                slot.role = _ARGS_RAW
                self._args_text(slot, s[j - 1])

    def _piece(self, text: str) -> None:
        slot = self._slot
        if slot is None:
            return
        if slot.role is _ARGS_STRING:
            self._args_text(slot, text)
        elif slot.role is not None:
            slot.parts.append(text)

    def _end(self, depth: int, kind: str) -> None:
        slot = self._slot
        self.trigger_end += 1 if kind == "0" else 0  # a number ends at the unconsumed s[j]
        if slot is None:
            return
        if depth == self._call_depth:
            self._close_slot(slot)
            return
        role, slot.role = slot.role, None
        if role is _KEY:
            self._key_read(slot, "".join(slot.parts))
        elif role is _NAME and not slot.settled:
            self._name_read(slot, "".join(slot.parts))

    def _key_read(self, slot: _Slot, key: str) -> None:
        group = "arguments" if key in _ARGS_KEYS else key
        if key != "name" and group != "arguments":
            return  # other keys ("id", "type", ...) are allowed and ignored
        if group in slot.seen:
            slot.duplicate = slot.duplicate or key
            return  # the duplicate's value is ignored; the verdict comes at the slot's end
        slot.seen.add(group)
        slot.key = key

    def _name_read(self, slot: _Slot, name: str) -> None:
        slot.name = name
        if name not in self._specs:
            declared = ", ".join(sorted(self._specs)[:20])
            self._invalid(slot, InvalidKind.UNKNOWN_TOOL,
                          f"unknown tool {name!r} (declared: {declared})", "".join(self._rec))
            return
        self._emit(CallStarted(slot.index, name))
        slot.started = True
        if slot.pending:
            self._out.args(slot.index, "".join(slot.pending))
            slot.pending = []

    def _close_slot(self, slot: _Slot) -> None:
        raw, self._rec = "".join(self._rec), []
        self._slot = None
        self._scanner.watch_depth = self._call_depth
        if not slot.settled:
            self._judge(slot, raw)

    def _error(self, message: str, s: str, j: int, base: int) -> None:
        self.trigger_end = j + 1
        reason = f"malformed JSON at offset {base + j}: {message}, got {s[j]!r}"
        raw = "".join(self._rec) + s[j]
        slot = self._slot
        if slot is not None:
            if not slot.settled:
                self._invalid(slot, InvalidKind.MALFORMED_JSON, reason, raw)
        elif self._scanner.failed_expecting_value:  # where a call had to begin
            self._invalid(_Slot(self._take_index(), ""), InvalidKind.MALFORMED_JSON, reason, raw.lstrip())
        # else: a separator or closer was expected after a finished call; the container
        # simply ended early (e.g. a forgotten ']' before </tool_call>): no verdict.

    # -- verdicts ------------------------------------------------------------------------------

    def _judge(self, slot: _Slot, raw: str) -> None:
        """Verdict for a slot whose value closed and that has none yet."""
        if slot.kind != "{":
            what = _TYPE_NAMES.get(slot.kind, "a value")
            return self._invalid(slot, InvalidKind.BAD_CALL,
                                 f"a tool call must be a JSON object, got {what}", raw)
        if slot.duplicate is not None:
            return self._invalid(slot, InvalidKind.BAD_CALL,
                                 f"duplicate key {slot.duplicate!r} in the tool call", raw)
        if slot.name is None:
            missing = "'name' must be a string" if slot.name_not_string else "the call has no 'name'"
            return self._invalid(slot, InvalidKind.MISSING_NAME, missing, raw)
        arguments, why = self._arguments(slot, raw)
        if why is not None:
            return self._invalid(slot, InvalidKind.BAD_ARGUMENTS, why, raw)
        why = self._specs[slot.name].schema_error(arguments)
        if why is not None:
            return self._invalid(slot, InvalidKind.SCHEMA_VIOLATION, why, raw)
        slot.settled = True
        self._emit(CallComplete(slot.index, slot.name, arguments, raw))

    def _arguments(self, slot: _Slot, raw: str) -> tuple[Any, str | None]:
        """(arguments, None) or (None, why). json.loads runs once per call, on the call's text."""
        if slot.args_key is None:
            self._args_text(slot, "{}")  # keeps "deltas parse to the arguments" true
            return {}, None
        try:
            value = strict_loads(raw)[slot.args_key]
        except ValueError as exc:  # unreachable if the scanner is right; never trust blindly
            return None, f"the call is not valid JSON: {exc}"
        if isinstance(value, str):
            try:
                value = strict_loads(value)
            except ValueError as exc:
                return None, f"{slot.args_key!r} is a string that does not hold JSON: {exc}"
        if not isinstance(value, dict):
            return None, f"{slot.args_key!r} must be a JSON object, got {type(value).__name__}"
        return value, None

    def _invalid(self, slot: _Slot, kind: InvalidKind, reason: str, raw: str) -> None:
        slot.settled = True
        slot.pending = []
        if slot is self._slot:  # stop reporting its members: the rest is only validated
            self._scanner.watch_depth = self._call_depth
        self._emit(CallInvalid(slot.index, reason, raw, slot.name, kind))

    def _emit(self, event: Any) -> None:
        self._out.emit(event)
        if isinstance(event, (CallComplete, CallInvalid)):
            self.verdict = event

    def _args_text(self, slot: _Slot, text: str) -> None:
        if slot.settled:
            return
        if slot.started:
            self._out.args(slot.index, text)
        else:
            slot.pending.append(text)

    def _take_index(self) -> int:
        index, self.next_index = self.next_index, self.next_index + 1
        return index


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def strict_loads(text: str) -> Any:
    """json.loads without the NaN / Infinity extensions (RFC 8259 JSON only)."""
    return json.loads(text, parse_constant=_reject_constant)
