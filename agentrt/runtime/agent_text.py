"""What goes into an agent turn and what comes out as text: a message normalised to chat
messages, and the final text without the tool-format markup a small model may echo."""

from __future__ import annotations

import re
from typing import Any

from agentrt.errors import ConfigError
from agentrt.toolcall.tags import CLOSE_TAG, OPEN_TAG, RESPONSE_CLOSE, RESPONSE_OPEN


def as_messages(message: Any) -> list[dict]:
    """str -> one user message; a dict -> [it]; a list of dicts -> as is."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    if isinstance(message, dict):
        return [message]
    if isinstance(message, (list, tuple)) and all(isinstance(m, dict) for m in message):
        return list(message)
    raise ConfigError("an agent takes a str, a message dict or a list of message dicts")


# the Hermes tags a small model may echo into its answer, and a tag cut off at a line's end
_ECHO_MARKUP = re.compile("|".join(map(re.escape, (OPEN_TAG, CLOSE_TAG, RESPONSE_OPEN, RESPONSE_CLOSE)))
                          + r"|<tool\s*$")


def clean_text(text: str) -> str:
    """Final text without tool-format markup a small model may echo (e.g. `<tool_response>`)."""
    lines = [ln for ln in (_ECHO_MARKUP.sub("", x).strip() for x in text.splitlines()) if ln]
    return "\n".join(dict.fromkeys(lines))  # echoed duplicate lines collapse to one
