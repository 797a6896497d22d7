"""Incremental lexer/decoder for the inside of one JSON string (after its opening quote).

Decoding follows `json.loads` exactly, including its surrogate handling: a `\\uD8xx` escape
directly followed by a `\\uDCxx` escape becomes one code point; any other surrogate escape is
kept as a lone surrogate. Since a high surrogate's partner may arrive in a later piece, a
decoded high surrogate is held back until the next character of the string is known.
"""

from __future__ import annotations

import re
from types import MappingProxyType

# Characters that end a run of plain string content: quote, backslash, control characters
# (json.loads is strict: raw U+0000..U+001F are errors inside strings).
_SPECIAL = re.compile(r'["\\\x00-\x1f]')
_HEX = "0123456789abcdefABCDEF"
_SIMPLE_ESCAPES = MappingProxyType(
    {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
)

_PLAIN, _BACKSLASH = 0, 1  # _esc states; 2..5 mean "inside \\u, (state - 2) hex digits read"


class StringLexer:
    """Consumes string content piece by piece; returns decoded text when asked to."""

    def __init__(self) -> None:
        self.reset()

    @property
    def plain(self) -> bool:
        """Not inside an escape and no surrogate held: plain content may be skipped freely."""
        return self._esc == _PLAIN and not self._high

    def reset(self) -> None:
        self._esc = _PLAIN
        self._code = 0  # value of the \u escape being read
        self._high = 0  # a decoded high surrogate awaiting its low half (0: none)

    def scan(self, s: str, i: int, decode: bool) -> tuple[int, str, bool, str | None]:
        """Consume from s[i]; return (j, text, closed, error).

        One call handles one of: a run of plain characters, one escape sequence (possibly
        continued from an earlier piece), or the closing quote. `text` is the decoded text
        of what was consumed (always "" when not `decode`); it is never returned together
        with `closed`. On error, s[j] is the offending character and it is not consumed.
        """
        if self._esc != _PLAIN:
            return self._escape(s, i, decode)
        m = _SPECIAL.search(s, i)
        j = m.start() if m else len(s)
        if j > i:
            return j, (self._take_high() + s[i:j]) if decode else "", False, None
        c = s[i]
        if c == "\\":
            self._esc = _BACKSLASH
            return self._escape(s, i + 1, decode)
        if c == '"':
            if self._high and decode:  # flush first; the quote is seen on the next call
                return i, self._take_high(), False, None
            return i + 1, "", True, None
        return i, "", False, "unescaped control character inside a string"

    def _escape(self, s: str, i: int, decode: bool) -> tuple[int, str, bool, str | None]:
        n = len(s)
        while i < n:
            c = s[i]
            if self._esc == _BACKSLASH:
                if c == "u":
                    self._esc, self._code = 2, 0
                elif c in _SIMPLE_ESCAPES:
                    self._esc = _PLAIN
                    return i + 1, (self._take_high() + _SIMPLE_ESCAPES[c]) if decode else "", False, None
                else:
                    return i, "", False, "invalid escape sequence in a string"
            elif c in _HEX:
                self._code = self._code * 16 + int(c, 16)
                self._esc += 1
                if self._esc == 6:
                    self._esc = _PLAIN
                    return i + 1, self._unicode(self._code) if decode else "", False, None
            else:
                return i, "", False, "invalid \\u escape (needs 4 hex digits)"
            i += 1
        return i, "", False, None

    def _unicode(self, code: int) -> str:
        """Decoded text for a completed \\uXXXX escape, pairing surrogates like json.loads."""
        if self._high and 0xDC00 <= code <= 0xDFFF:
            pair = 0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00)
            self._high = 0
            return chr(pair)
        out = self._take_high()
        if 0xD800 <= code <= 0xDBFF:
            self._high = code
            return out
        return out + chr(code)

    def _take_high(self) -> str:
        if not self._high:
            return ""
        high, self._high = self._high, 0
        return chr(high)
