"""The Hermes/Qwen tool-call tags (the one place their text is written: formats, the fallback chat
format, the agent's clean-up) and incremental matching of them."""

from __future__ import annotations

import re

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
# a tool result in the fallback chat format (conversation/messages.py), as Hermes-trained models read it
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
WS_RUN = re.compile(r"[ \t\n\r]+")  # JSON whitespace


def match_literal(literal: str, matched: int, s: str, i: int) -> tuple[int, int]:
    """Extend a match of literal[:matched] with s[i:]; return (matched, j).

    matched == len(literal): complete, s[i:j] consumed. Else j == len(s): still a prefix.
    Else s[j] mismatches and is not consumed. Both tags contain '<' only at position 0, so
    after a mismatch no suffix of the matched text can start a new tag: the caller only needs
    to re-examine s[j].
    """
    n, size = len(s), len(literal)
    while matched < size and i < n and s[i] == literal[matched]:
        matched, i = matched + 1, i + 1
    return matched, i


def skip_ws(s: str, i: int) -> int:
    """Index of the first non-whitespace character of s at or after i (len(s) if none)."""
    m = WS_RUN.match(s, i)
    return m.end() if m else i
