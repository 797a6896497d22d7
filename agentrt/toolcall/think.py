"""Reasoning blocks (Qwen3 / DeepSeek-R1 style `<think>...</think>` at the start of a message),
split from the answer while streaming, so they never reach tool-call parsing or the text handed
back to callers (unless asked for: `ReasoningDelta` events).

Sans-I/O like the parser: `feed(text)` -> [(kind, text)] with kind "reasoning" or "answer";
text is held only while it may still be the start of `<think>` / `</think>`. Whitespace right
after `</think>` is dropped (templates write "</think>\\n\\n" before the answer).
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningDelta:
    """Text of the model's reasoning block (only when the caller asks for reasoning)."""

    text: str


class ThinkSplitter:
    def __init__(self) -> None:
        self._state = "start"  # start -> (think -> after) | answer
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        text, self._held = self._held + text, ""
        while text:
            if self._state == "start":
                body = text.lstrip()
                if OPEN.startswith(body) and len(body) < len(OPEN):
                    self._held = text  # maybe the tag: wait
                    return out
                if body.startswith(OPEN):
                    self._state, text = "think", body[len(OPEN):]
                else:
                    self._state = "answer"
            elif self._state == "think":
                k = text.find(CLOSE)
                if k >= 0:
                    out.append(("reasoning", text[:k]))
                    self._state, text = "after", text[k + len(CLOSE):]
                    continue
                keep = _partial_suffix(text, CLOSE)
                out.append(("reasoning", text[:len(text) - keep]))
                self._held = text[len(text) - keep:]
                return [o for o in out if o[1]]
            elif self._state == "after":
                text = text.lstrip()
                if text:
                    self._state = "answer"
            else:
                out.append(("answer", text))
                text = ""
        return [o for o in out if o[1]]

    def close(self) -> list[tuple[str, str]]:
        held, self._held = self._held, ""
        if not held:
            return []
        return [("reasoning" if self._state == "think" else "answer", held)]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
