"""Turning tool outputs and argument errors into text a model can read.

`format_result` is the only way a tool's return value becomes message content: strings pass
through, everything else becomes JSON. A value that has no sensible text form is a mistake in
the tool, so it raises ToolCallError with a message that says what to return instead (the
dispatcher turns that into an error result rather than sending `repr()` noise to the model).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import enum
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath
from typing import Any

import pydantic
import pydantic_core

from agentrt.errors import ConfigError, ToolCallError

_MAX_ERRORS = 5  # argument errors listed per message; the model fixes a few at a time anyway
_MAX_INPUT_REPR = 60


@dataclass(frozen=True)
class ToolResult:
    """The outcome of one tool call, ready to be sent back to the model as a `tool` message.

    `attempts` counts invocations of the tool's function: 0 when the call never reached it
    (unknown tool, invalid arguments), 1 + retries used otherwise. `raw` is the Python value
    the tool returned (None for error results).
    """

    call_id: str
    name: str
    content: str
    is_error: bool = False
    raw: Any = None
    attempts: int = 0
    duration_s: float = 0.0

    def to_message(self) -> dict[str, str]:
        """The OpenAI-style chat message carrying this result."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


class _Unserialisable(TypeError):
    """Raised from the json `default` hook; carries the offending type's name."""

    def __init__(self, value: object) -> None:
        self.type_name = type(value).__qualname__
        super().__init__(self.type_name)


def format_result(value: Any, *, max_chars: int | None = None) -> str:
    """`value` as message text: str as is, pydantic models and other values as JSON.

    With `max_chars`, longer text keeps its first `max_chars` characters followed by a
    marker saying how much was cut. Raises ToolCallError when `value` cannot become text.
    """
    check_max_chars(max_chars)
    return truncate(_to_text(value), max_chars)


def check_max_chars(max_chars: object) -> None:
    """ConfigError unless `max_chars` is a positive int or None."""
    if max_chars is None:
        return
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ConfigError(f"max_chars must be a positive int or None, got {max_chars!r}")


def truncate(text: str, max_chars: int | None) -> str:
    """`text` cut to `max_chars` characters plus a marker; unchanged when it fits or no limit."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n…[truncated: showing {max_chars} of {len(text)} characters]"


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        if isinstance(value, pydantic.BaseModel):
            return value.model_dump_json()
        return json.dumps(value, ensure_ascii=False, default=_json_default)
    except _Unserialisable as exc:
        raise ToolCallError(
            f"tool returned an object of type {exc.type_name} that cannot be turned into text; "
            "return a str, dict, list or pydantic model"
        ) from None
    except (TypeError, ValueError, pydantic_core.PydanticSerializationError) as exc:
        # e.g. circular references, dict keys that are not str/int/float/bool/None
        raise ToolCallError(f"tool returned a value that cannot be turned into JSON text: {exc}") from None


def _json_default(value: Any) -> Any:
    """json.dumps hook for the non-JSON types a tool commonly returns."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (uuid.UUID, Decimal, PurePath)):
        return str(value)  # str keeps a Decimal exact
    if isinstance(value, (set, frozenset)):
        return _sorted_if_possible(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _bytes_text(bytes(value))
    if isinstance(value, Mapping):
        return dict(value)
    raise _Unserialisable(value)


def _sorted_if_possible(items: set | frozenset) -> list:
    try:
        return sorted(items)  # a stable order, so the same result gives the same text
    except TypeError:
        return list(items)


def _bytes_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode("ascii")


def describe_validation_error(exc: pydantic.ValidationError, accepted: tuple[str, ...] = ()) -> str:
    """A short, model-readable summary of `exc`: one `field: problem` clause per error.

    `accepted` names the tool's parameters, listed when the model sent an unknown one.
    """
    errors = exc.errors(include_url=False)
    parts = [_describe_one(err, accepted) for err in errors[:_MAX_ERRORS]]
    if len(errors) > _MAX_ERRORS:
        more = len(errors) - _MAX_ERRORS
        parts.append(f"and {more} more error{'s' if more > 1 else ''}")
    return "; ".join(parts)


def _describe_one(err: Mapping[str, Any], accepted: tuple[str, ...]) -> str:
    where = _location(err.get("loc", ()))
    kind = err.get("type")
    if kind == "missing":
        return f"{where}: missing required argument"
    if kind == "extra_forbidden":
        takes = ", ".join(accepted) if accepted else "no arguments"
        return f"{where}: unexpected argument (this tool takes: {takes})"
    got = repr(err.get("input"))
    if len(got) > _MAX_INPUT_REPR:
        got = got[: _MAX_INPUT_REPR - 3] + "..."
    return f"{where}: {err.get('msg', 'invalid value')} (got {got})"


def _location(loc: tuple[Any, ...]) -> str:
    """('filters', 'tags', 0) -> 'filters.tags[0]'; the empty location is the whole object."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "arguments"
