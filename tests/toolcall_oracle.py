"""A non-streaming reference for the tool-call parser, built on json + jsonschema only.

It reads a *complete* message with `json.JSONDecoder.raw_decode` (never the streaming scanner)
and applies the documented rules, for the default options (parallel_calls=True,
max_calls=None, stop_on_invalid=True). It predicts the assistant text, the ordered verdicts
(kind, name, arguments) and whether the parser ends up stopped.

It does not model messages that end inside JSON (raises Unsupported): truncation is tested
by comparing a stream's prefixes with the full stream instead.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

WS = " \t\n\r"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
COMPLETE = "complete"
_STRING = r'"(?:[^"\\\x00-\x1f]|\\.)*"'
_NAME_FIRST = re.compile(r"\{[ \t\n\r]*(" + _STRING + r")[ \t\n\r]*:[ \t\n\r]*(" + _STRING + ")")
_PARTIAL_SCALAR = re.compile(r"-|-?\d+\.?|-?\d+(\.\d+)?[eE][+-]?|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")


class Unsupported(Exception):
    """The message ends inside JSON; the oracle does not predict truncation."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constants)


@dataclass
class Expected:
    text: str = ""
    verdicts: list[tuple[str, str | None, Any]] = field(default_factory=list)
    stopped: bool = False
    ends: list[int] = field(default_factory=list)  # end offset of each complete call object


def reference(message: str, tools: dict[str, dict], wrapper: str) -> Expected:
    out = Expected()
    body = message.lstrip(WS)
    start = len(message) - len(body)
    if wrapper != "hermes" and (body[:1] == "{" or (body[:1] == "[" and wrapper == "json")):
        _bare(message, start, tools, out)
    elif wrapper == "json":
        out.text = message
    else:
        _hermes(message, tools, out)
    return out


def _skip(msg: str, pos: int) -> int:
    while pos < len(msg) and msg[pos] in WS:
        pos += 1
    return pos


def _hermes(msg: str, tools: dict, out: Expected) -> None:
    k = msg.find(OPEN)
    if k < 0:
        out.text = msg
        return
    out.text, pos = msg[:k], k + len(OPEN)
    while True:
        result = _container(msg, _skip(msg, pos), tools, out, in_tag=True)
        if out.stopped or result is None:
            return
        end, ok = result
        if not ok:  # the JSON ended early without a verdict: skip to the closing tag
            c = msg.find(CLOSE, end)
            if c < 0:
                return
            pos = c + len(CLOSE)
        else:
            pos = _skip(msg, end)
            if CLOSE.startswith(msg[pos:]):
                return  # end of message, possibly inside the closing tag
            if not msg.startswith(CLOSE, pos):
                out.stopped = True
                return
            pos += len(CLOSE)
        pos = _skip(msg, pos)
        if OPEN.startswith(msg[pos:]):
            return
        if not msg.startswith(OPEN, pos):
            out.stopped = True
            return
        pos += len(OPEN)


def _bare(msg: str, pos: int, tools: dict, out: Expected) -> None:
    while True:
        is_list = msg[pos] == "["
        result = _container(msg, pos, tools, out, in_tag=False)
        if out.stopped or result is None:
            return
        end, ok = result
        if not ok or is_list:
            out.stopped = True
            return
        pos = _skip(msg, end)
        if pos == len(msg):
            return
        if msg[pos] != "{":
            out.stopped = True
            return


def _container(msg: str, pos: int, tools: dict, out: Expected, *, in_tag: bool):
    """(end, ok) after the container; None when the message ended or the parser stopped."""
    if pos >= len(msg):
        out.verdicts.append(("incomplete", None, None))
        return None
    if msg[pos] != "[":
        end = _element(msg, pos, tools, out)
        return None if end is None else (end, True)
    pos = _skip(msg, pos + 1)
    if msg.startswith("]", pos):
        return pos + 1, True
    while True:
        end = _element(msg, pos, tools, out)
        if end is None:
            return None
        pos = _skip(msg, end)
        if pos >= len(msg):
            raise Unsupported(msg)
        if msg[pos] == "]":
            return pos + 1, True
        if msg[pos] != ",":
            return pos, False  # a separator was due after a finished call: no verdict
        pos = _skip(msg, pos + 1)


def _element(msg: str, pos: int, tools: dict, out: Expected) -> int | None:
    """Append this element's verdict; its end, or None when the parser stops here."""
    try:
        value, end = _DECODER.raw_decode(msg, pos)
    except ValueError as exc:
        err = getattr(exc, "pos", 0)  # parse_constant's ValueError (NaN...) has no position
        if err >= len(msg) or "Unterminated" in str(exc) or _PARTIAL_SCALAR.fullmatch(msg[err:]):
            raise Unsupported(msg) from None
        name = _name_first(msg, pos, tools)
        kind = "unknown_tool" if name is not None else "malformed_json"
        return _verdict(out, kind, name, None)
    if not isinstance(value, dict):
        return _verdict(out, "bad_call", None, None)
    pairs = json.loads(msg[pos:end], object_pairs_hook=lambda p: p)
    names = [v for k, v in pairs if k == "name"]
    name = names[0] if names and isinstance(names[0], str) else None
    if name is not None and name not in tools:
        return _verdict(out, "unknown_tool", name, None)
    groups = ["arguments" if k == "parameters" else k for k, _ in pairs]
    if groups.count("name") > 1 or groups.count("arguments") > 1:
        return _verdict(out, "bad_call", name, None)
    if name is None:
        return _verdict(out, "missing_name", None, None)
    arg_keys = [k for k, _ in pairs if k in ("arguments", "parameters")]
    args = value[arg_keys[0]] if arg_keys else {}
    if isinstance(args, str):
        try:
            args = _DECODER.decode(args)
        except ValueError:
            return _verdict(out, "bad_arguments", name, None)
    if not isinstance(args, dict):
        return _verdict(out, "bad_arguments", name, None)
    try:
        jsonschema.validate(args, tools[name])
    except jsonschema.ValidationError:
        return _verdict(out, "schema_violation", name, None)
    out.verdicts.append((COMPLETE, name, args))
    out.ends.append(end)
    return end


def _verdict(out: Expected, kind: str, name: str | None, args: Any) -> None:
    """Record an invalid verdict; the parser stops there (stop_on_invalid=True)."""
    out.verdicts.append((kind, name, args))
    out.stopped = True  # stop_on_invalid=True
    return None


def _name_first(msg: str, pos: int, tools: dict) -> str | None:
    """The declared-or-not name when the object begins with a complete "name" string member
    that is unknown (the parser rejects it when it closes, before any later error)."""
    m = _NAME_FIRST.match(msg, pos)
    if not m:
        return None
    try:
        key, name = json.loads(m.group(1)), json.loads(m.group(2))
    except ValueError:
        return None
    return name if key == "name" and name not in tools else None
