"""Fast-forward over text the grammar forces (jump-forward decoding), spelled the tokenizer's way.

Once the model has picked a tool's name, the grammar admits exactly one continuation for a while
(`", "arguments": {"city": "`); at the start of a required call it forces `<tool_call>{"name": "`.
`fast_forward` turns that text into the ids the tokenizer gives it, so that the engine feeds them
in one chunk (one step) instead of one decode step per token:

  * **canonical ids.** The forced text is tokenized by the tokenizer (the format's tags that are
    control tokens stay control tokens), never in the odd pieces a constrained greedy choice
    makes of it (`<`, `t`, `oo`, `l` for `<tool_call>` on SmolLM2-135M); what the session keeps
    is then the tokenization the model was trained on.
  * **healing at the start.** The model's last token and the forced text are tokenized together;
    where the tokenizer spells them differently from [last, ...] (`c` + `elsius"` -> `cel`,
    `sius"`), `last` is replaced by that spelling (the same text).
  * **holding back at the end.** Where the grammar, after all but the last forced token, allows a
    longer token that begins with the last one's text (the model's next words could merge with
    it), the last token is left for the model to choose.
  * **the end.** When only end-of-turn can follow, the first end-of-turn id the grammar allows is
    appended: the request ends without another step.

The engine appends the result after the sampled token (engine/core.py); `model/generate.py`
(`fast_forward=True`) feeds it one token per step, the reference the engine is tested against.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence

import numpy as np

from agentrt.model.tokenizer import Tokenizer


class ForcedText:
    """What fast-forward needs of one tokenizer: canonical encoding of forced text and, per
    token, the longer tokens that begin with its bytes. Built once per GrammarFactory."""

    def __init__(self, tokenizer: Tokenizer, tags: frozenset[int]) -> None:
        self._tok = tokenizer
        self._special = frozenset(tokenizer.special_tokens.values())
        self._tags = {tokenizer.token_bytes(i).decode("utf-8"): i for i in tags}
        self._split = re.compile("(" + "|".join(map(re.escape, self._tags)) + ")") if self._tags else None
        self._vocab = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        order = sorted(range(len(self._vocab)), key=self._vocab.__getitem__)
        self._order = np.asarray(order, dtype=np.int64)
        self._keys = [self._vocab[i] for i in order]

    def encode(self, text: str) -> list[int]:
        """Ids of forced text: the format's tags as their control tokens, the rest as the
        tokenizer encodes it (one piece between tags)."""
        if self._split is None:
            return self._tok.encode(text)
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._tags:
                ids.append(self._tags[piece])
            elif piece:
                ids += self._tok.encode(piece)
        return ids

    def text_of(self, token: int) -> str | None:
        """The text of a model token that forced text may merge with (None: a control token,
        or bytes that are not whole UTF-8 characters)."""
        if token in self._special or not 0 <= token < len(self._vocab):
            return None
        try:
            return self._vocab[token].decode("utf-8")
        except UnicodeDecodeError:
            return None

    def extensions(self, token: int) -> np.ndarray:
        """Ids of the tokens whose bytes begin with `token`'s and are longer."""
        b = self._vocab[token]
        if not b or token in self._special:
            return self._order[:0]
        # sorted: the extensions of b lie between b and the first key past every b + ...
        lo = bisect.bisect_right(self._keys, b)
        stem = b.rstrip(b"\xff")
        hi = bisect.bisect_left(self._keys, stem[:-1] + bytes([stem[-1] + 1])) if stem else len(self._keys)
        return self._order[lo:hi]


def utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 characters ("" if it starts mid-character)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class Jump:
    """One fast-forward over matcher `m` (accepting as it goes); `words()` fills and returns the
    allowed-token bitmask words of m's current state; `eos` the end-of-turn ids."""

    def __init__(self, m, forced: ForcedText, eos: Sequence[int], words: Callable[[], np.ndarray]) -> None:
        self.m, self.forced, self.eos, self.words = m, forced, tuple(eos), words
        self._room = 0  # (run's cap, which the end-of-turn respects too)

    def run(self, last: int | None, room: int) -> tuple[int, list[int]]:
        """(replaced, ids) right after m accepted `last` (None: at the start of the output): `ids`
        replace the last `replaced` (0 or 1) tokens and follow them; m has accepted exactly
        them. (0, []) when nothing is forced. At most `room` ids."""
        if room < 1:
            return 0, []
        self._room = room
        text = utf8_prefix(self.m.forced_bytes())
        if not text:
            return 0, self._end([])
        head = self.forced.text_of(last) if last is not None else None
        if head:
            joined = self.forced.encode(head + text)
            if joined[0] != last and self._swap(last, joined[:room]):  # healed: spelled canonically
                return 1, self._hold_back(joined[:room], keep=1)
            ids = joined[1:] if joined[0] == last else self.forced.encode(text)
        else:
            ids = self.forced.encode(text)
        ids = ids[:room]
        if not ids or not self._swap(None, ids):
            return 0, []
        return 0, self._hold_back(ids, keep=0)

    def _swap(self, undo: int | None, ids: Sequence[int]) -> bool:
        """Roll back `undo` (the last accepted token) if given and accept `ids`; on a refusal
        the state is restored and False returned."""
        if undo is not None:
            self.m.rollback(1)
        for n, t in enumerate(ids):
            if not self.m.accept(int(t)):
                if n:
                    self.m.rollback(n)
                if undo is not None:
                    self.m.accept(undo)
                return False
        return True

    def _hold_back(self, ids: list[int], keep: int) -> list[int]:
        """Leave the last id to the model where a longer allowed token begins with it; append
        the end-of-turn where nothing else can follow. `keep`: leading ids never held back."""
        ended = self._end(ids)
        if ended is not ids or len(ids) <= keep:
            return ended
        longer = self.forced.extensions(ids[-1])
        if not longer.size:
            return ids
        self.m.rollback(1)
        words = self.words()
        if ((words[longer >> 5].astype(np.int64) >> (longer & 31)) & 1).any():
            return ids[:-1]
        self.m.accept(ids[-1])
        return ids

    def _end(self, ids: list[int]) -> list[int]:
        """ids + [eos] (accepted) when the output is complete and only end-of-turn may follow."""
        if len(ids) >= self._room or not self.m.completed() or self.m.is_terminated():
            return ids
        words = self.words()
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        if allowed.size and all(int(t) in self.eos for t in allowed):
            eos = next(t for t in self.eos if t in set(allowed.tolist()))
            if self.m.accept(eos):
                return ids + [eos]
        return ids
