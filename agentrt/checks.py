"""Argument checks shared by the public constructors and entry points: each returns the value
normalised (a numpy/torch integer -> int, an int -> float) or raises ConfigError naming the
argument, what it got and what it accepts."""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping
from typing import Any

from agentrt.errors import ConfigError


def _got(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None) -> int:
    """An integer (bools and floats such as 2.0 rejected) in [min, max]."""
    if isinstance(value, (bool, float, str, bytes)) or value is None:
        ok = False
    else:
        try:
            value = operator.index(value)
            ok = True
        except TypeError:
            ok = False
    if not ok:
        raise ConfigError(f"{name} must be an int, got {_got(value)}")
    if min is not None and value < min:
        raise ConfigError(f"{name} must be >= {min}, got {value}")
    if max is not None and value > max:
        raise ConfigError(f"{name} must be <= {max}, got {value}")
    return value


def check_float(name: str, value: Any, *, min: float | None = None, max: float | None = None,
                min_open: bool = False, allow_inf: bool = False) -> float:
    """A real number (bools and strings rejected), finite unless allow_inf, never NaN, in
    [min, max] ((min, max] with min_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number, got {_got(value)}")
    try:
        value = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be a number, got {_got(value)}") from None
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ConfigError(f"{name} must be a finite number, got {value}")
    if min is not None and (value <= min if min_open else value < min):
        raise ConfigError(f"{name} must be {'>' if min_open else '>='} {min}, got {value}")
    if max is not None and value > max:
        raise ConfigError(f"{name} must be <= {max}, got {value}")
    return value


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {_got(value)}")
    return value


def check_choice(name: str, value: Any, choices: tuple) -> Any:
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}; got {_got(value)}")
    return value


def check_optional_str(name: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name} must be a str or None, got {_got(value)}")
    return value


def check_adapter_name(name: str, value: Any) -> str | None:
    """None (the base model) or the name of a LoRA adapter loaded on the engine."""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{name} must be the name of an adapter loaded on the engine "
                          f"(engine.load_adapter(name, path)) or None, got {_got(value)}")
    return value


def check_timeout(name: str, value: Any) -> float | None:
    """None (the default) or a finite number of seconds >= 0."""
    if value is None:
        return None
    return check_float(name, value, min=0.0)


_CHOICE_HELP = ("tool_choice must be 'auto', 'none', 'required' (or 'any'), a tool name, or "
                "{'type': 'function', 'function': {'name': ...}}")


def check_tool_choice(value: Any, tool_names: tuple[str, ...] | None = None) -> Any:
    """A tool_choice value as the grammars take it; a named tool must be in `tool_names` (when
    given)."""
    name = None
    if value is None or value in ("auto", "none", "required", "any"):
        return value
    if isinstance(value, str) and value:
        name = value
    elif isinstance(value, Mapping):
        fn = value.get("function")
        if value.get("type") == "function" and isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            name = fn["name"]
    if name is None:
        raise ConfigError(f"{_CHOICE_HELP}; got {_got(value)}")
    if tool_names is not None and name not in tool_names:
        raise ConfigError(f"tool_choice names the tool {name!r}, which is not among the tools "
                          f"{sorted(tool_names)}; pass that tool or choose one of these")
    return value


__all__ = ["check_bool", "check_choice", "check_float", "check_int", "check_optional_str", "check_timeout",
           "check_tool_choice"]


def set_frozen(obj: Any, name: str, value: Any) -> None:
    """Set a frozen dataclass's field to its checked, normalised value: only from its
    `__post_init__` (and so again on each `replace()` copy), so a frozen value is only ever
    seen normalised."""
    object.__setattr__(obj, name, value)
