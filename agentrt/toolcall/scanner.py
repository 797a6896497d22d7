"""Incremental JSON scanner: validates one JSON value fed in pieces and reports its shallow shape.

Sans-I/O and pull-style: `scan(s, i)` consumes `s` from index `i` until it has something to
report or the piece ends, and returns `(j, token)`; the caller calls again from `j`. State
carries across pieces, so a value may be split anywhere (inside strings, escapes, numbers,
literals). Each character is examined a bounded number of times and string contents and
whitespace runs are skipped with C-level regex searches, so the total work is O(input).

Validation is strict RFC 8259, the language `json.loads` accepts minus its NaN/Infinity
extensions: a text this scanner accepts always parses with `json.loads`, and the first
character it rejects is the first one no JSON text can continue with.

Tokens are tuples `(kind, depth, data)`; depth counts the containers enclosing the value (the
root value has depth 0). START/END are reported only for values with depth <= `watch_depth`:

    (START, d, c)     a value began; c is '{', '[', '"' (string value), 'k' (object key),
                      '0' (number) or 't' (true/false/null); its first character is s[j-1]
    (PIECE, d, text)  decoded text of the current string (only after setting `decode`)
    (END, d, c)       the value ended: it is s[..j] (a number ends when a character that
                      cannot continue it arrives; that character, s[j], is not consumed)
    (ERROR, d, msg)   s[j] cannot continue the JSON text; it is not consumed, the scanner is
                      `failed` and accepts nothing more
"""

from __future__ import annotations

import re

from agentrt.toolcall.strings import StringLexer
from agentrt.toolcall.tags import skip_ws

START, PIECE, END, ERROR = "start", "piece", "end", "error"

# Modes: what the scanner expects next. Structural modes come first (whitespace allowed).
VALUE, VALUE_OR_CLOSE, KEY_OR_CLOSE, KEY, COLON, AFTER_VALUE = range(6)
STRING, NUMBER, LITERAL, DONE, FAILED = range(6, 11)

_PLAIN_RUN = re.compile(r'[^"\\\x00-\x1f]+')  # string content needing no attention
_WS = " \t\n\r"
_DIGITS = "0123456789"
_LITERALS = (("t", "true"), ("f", "false"), ("n", "null"))

# Number grammar  -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
_N_MINUS, _N_ZERO, _N_INT, _N_DOT, _N_FRAC, _N_E, _N_ESIGN, _N_EXP = range(8)
_N_ACCEPTING = frozenset((_N_ZERO, _N_INT, _N_FRAC, _N_EXP))


def _number_next(state: int, c: str) -> int:
    """The number state after `c`, or -1 when `c` cannot continue the number."""
    digit = c in _DIGITS
    if state == _N_MINUS:
        return _N_ZERO if c == "0" else _N_INT if digit else -1
    if state in (_N_INT, _N_FRAC, _N_EXP) and digit:
        return state
    if state == _N_DOT:
        return _N_FRAC if digit else -1
    if state == _N_E:
        return _N_ESIGN if c in "+-" else _N_EXP if digit else -1
    if state == _N_ESIGN:
        return _N_EXP if digit else -1
    if c == "." and state in (_N_ZERO, _N_INT):
        return _N_DOT
    if c in "eE" and state in (_N_ZERO, _N_INT, _N_FRAC):
        return _N_E
    return -1


class JsonScanner:
    """Validates one JSON value incrementally; see the module docstring for the token contract."""

    def __init__(self, watch_depth: int = 0) -> None:
        self.watch_depth = watch_depth  # report START/END for values this shallow
        self.decode = False  # set after a string START to receive its PIECE tokens
        self.steps = 0  # loop iterations so far: a work counter for linearity checks
        self._stack: list[str] = []  # '{' / '[' of the open containers
        self._mode = VALUE
        self._failed_mode = VALUE  # the mode an error happened in
        self._is_key = False
        self._strlex = StringLexer()
        self._num = _N_INT
        self._lit = ""  # the literal being matched ("true", ...)
        self._lit_i = 0  # how many of its characters were matched

    @property
    def done(self) -> bool:
        """The root value is complete; nothing more is consumed."""
        return self._mode == DONE

    @property
    def failed(self) -> bool:
        return self._mode == FAILED

    @property
    def depth(self) -> int:
        return len(self._stack)

    @property
    def failed_expecting_value(self) -> bool:
        """The error hit where a value (not a separator or closer) had to start."""
        return self.failed and self._failed_mode in (VALUE, VALUE_OR_CLOSE)

    def scan(self, s: str, i: int) -> tuple[int, tuple | None]:
        """Consume s[i:] until a token is due or the piece ends; see the module docstring."""
        n = len(s)
        while i < n:
            self.steps += 1
            mode = self._mode
            if mode == STRING:
                if not self.decode and self._strlex.plain:  # fast path: skip plain content
                    m = _PLAIN_RUN.match(s, i)
                    if m is not None:
                        i = m.end()
                        continue
                i, tok = self._string(s, i)
            elif mode == NUMBER:
                i, tok = self._number(s, i)
            elif mode == LITERAL:
                i, tok = self._literal(s, i)
            elif mode >= DONE:
                return i, None
            elif s[i] in _WS:
                i = skip_ws(s, i)  # s[i] is whitespace: the run is non-empty
                continue
            else:
                i, tok = self._structural(s, i)
            if tok is not None:
                return i, tok
        return i, None

    # -- structure -----------------------------------------------------------------------------

    def _structural(self, s: str, i: int) -> tuple[int, tuple | None]:
        c, mode = s[i], self._mode
        if mode == AFTER_VALUE:
            top = self._stack[-1]
            if c == ",":
                self._mode = KEY if top == "{" else VALUE
                return i + 1, None
            if c == ("}" if top == "{" else "]"):
                return self._close(i)
            return self._fail(i, f"expected ',' or {'}' if top == '{' else ']'!r}")
        if mode == COLON:
            if c == ":":
                self._mode = VALUE
                return i + 1, None
            return self._fail(i, "expected ':' after an object key")
        if mode in (KEY_OR_CLOSE, KEY):
            if c == '"':
                return self._begin_string(i, is_key=True)
            if c == "}" and mode == KEY_OR_CLOSE:
                return self._close(i)
            return self._fail(i, "expected a string key" + (" or '}'" if mode == KEY_OR_CLOSE else ""))
        if c == "]" and mode == VALUE_OR_CLOSE:
            return self._close(i)
        return self._begin_value(i, c)

    def _begin_value(self, i: int, c: str) -> tuple[int, tuple | None]:
        depth = len(self._stack)
        if c == '"':
            return self._begin_string(i, is_key=False)
        if c in "{[":
            self._stack.append(c)
            self._mode = KEY_OR_CLOSE if c == "{" else VALUE_OR_CLOSE
            kind = c
        elif c == "-" or c in _DIGITS:
            self._mode = NUMBER
            self._num = _N_MINUS if c == "-" else _N_ZERO if c == "0" else _N_INT
            kind = "0"
        else:
            for first, word in _LITERALS:
                if c == first:
                    self._mode, self._lit, self._lit_i = LITERAL, word, 1
                    break
            else:
                return self._fail(i, "expected a JSON value")
            kind = "t"
        return i + 1, (START, depth, kind) if depth <= self.watch_depth else None

    def _begin_string(self, i: int, *, is_key: bool) -> tuple[int, tuple | None]:
        depth = len(self._stack)
        self._mode, self._is_key = STRING, is_key
        self._strlex.reset()
        self.decode = False
        if depth <= self.watch_depth:
            return i + 1, (START, depth, "k" if is_key else '"')
        return i + 1, None

    def _close(self, i: int) -> tuple[int, tuple | None]:
        kind = self._stack.pop()
        depth = len(self._stack)
        self._after_value()
        return i + 1, (END, depth, kind) if depth <= self.watch_depth else None

    def _after_value(self) -> None:
        self._mode = AFTER_VALUE if self._stack else DONE

    def _fail(self, i: int, message: str) -> tuple[int, tuple]:
        self._failed_mode, self._mode = self._mode, FAILED
        return i, (ERROR, len(self._stack), message)

    # -- scalars -------------------------------------------------------------------------------

    def _string(self, s: str, i: int) -> tuple[int, tuple | None]:
        j, piece, closed, error = self._strlex.scan(s, i, self.decode)
        depth = len(self._stack)
        if error:
            return self._fail(j, error)
        if piece:  # the lexer never returns text and the closing quote together
            return j, (PIECE, depth, piece)
        if not closed:
            return j, None
        kind = "k" if self._is_key else '"'
        if self._is_key:
            self._mode = COLON
        else:
            self._after_value()
        return j, (END, depth, kind) if depth <= self.watch_depth else None

    def _number(self, s: str, i: int) -> tuple[int, tuple | None]:
        n, state = len(s), self._num
        while i < n:
            nxt = _number_next(state, s[i])
            if nxt < 0:
                break
            state, i = nxt, i + 1
        self._num = state
        if i == n:
            return i, None
        if state not in _N_ACCEPTING:
            return self._fail(i, "invalid number")
        depth = len(self._stack)
        self._after_value()
        return i, (END, depth, "0") if depth <= self.watch_depth else None

    def _literal(self, s: str, i: int) -> tuple[int, tuple | None]:
        word, k, n = self._lit, self._lit_i, len(s)
        while i < n and k < len(word):
            if s[i] != word[k]:
                self._lit_i = k
                return self._fail(i, f"invalid literal (expected {word!r})")
            i, k = i + 1, k + 1
        self._lit_i = k
        if k < len(word):
            return i, None
        depth = len(self._stack)
        self._after_value()
        return i, (END, depth, "t") if depth <= self.watch_depth else None
