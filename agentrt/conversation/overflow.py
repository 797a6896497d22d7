"""Context overflow policy: what a conversation does before a round would not fit the context.

    ContextPolicy(mode="trim", tool_result_tokens=2048)   # the default

1. **Oversized tool results** are cut to `tool_result_tokens` tokens when they are appended, with a
   marker the model can read (`[... truncated: the first N of about M tokens shown]`). The text is
   cut by characters first, so a 1 MB result is never tokenized whole; `Conversation.add()` also
   encodes big messages in a worker thread, off the event loop.
2. **Before a round**, if the prompt plus the reply's room (`max_tokens`) exceeds the engine's
   limit (`Engine.max_context_tokens`): mode "trim" drops the oldest tool rounds (an assistant
   message with tool calls and the tool results answering it), then the oldest other turns, always
   keeping the system prompt and the latest user message; the conversation is re-encoded from the
   first dropped message on, so the session's prefix rollback recomputes only that suffix. Mode
   "raise" raises ContextLengthExceeded at once, as does "trim" when even the kept messages do not
   fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrt.errors import ConfigError

MODES = ("trim", "raise")
_CHARS_PER_TOKEN_MAX = 16  # no tokenizer spends fewer tokens per character than 1/16
# the end of the ContextLengthExceeded message when nothing more can be dropped
NO_ROOM = " even after dropping old turns; start a new conversation, shorten the instructions, or lower max_tokens"


@dataclass(frozen=True)
class ContextPolicy:
    mode: str = "trim"
    tool_result_tokens: int | None = 2048  # None: tool results are never cut

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"ContextPolicy.mode must be one of {MODES}, got {self.mode!r}")
        n = self.tool_result_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 16):
            raise ConfigError(f"ContextPolicy.tool_result_tokens must be None or an int >= 16, got {n!r}")

    def cut_tool_result(self, tokenizer: Any, content: str) -> str:
        """content, or its head with a marker when it holds more than tool_result_tokens tokens."""
        limit = self.tool_result_tokens
        if limit is None or len(content) <= limit:  # at least one character per token
            return content
        head = content[:limit * _CHARS_PER_TOKEN_MAX]
        ids = tokenizer.encode(head)
        if len(ids) <= limit and len(head) == len(content):
            return content
        kept = tokenizer.decode(ids[:limit])
        total = len(ids) if len(head) == len(content) else round(len(ids) * len(content) / len(head))
        return f"{kept}\n[... truncated: the first {limit} of about {total} tokens shown]"


def droppable(messages: list[dict]) -> list[list[int]]:
    """Groups of message indices that may be dropped, in order: the tool rounds (an assistant
    message with tool calls + the tool results after it) before the latest user message, oldest
    first; then the whole exchanges (a user message and what follows it up to the next one) before
    it, oldest first. The system prompt, the latest user message and what follows stay."""
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return []
    last = users[-1]
    rounds, i = [], 0
    while i < last:
        if messages[i]["role"] == "assistant" and messages[i].get("tool_calls"):
            j = i + 1
            while j < last and messages[j]["role"] == "tool":
                j += 1
            rounds.append(list(range(i, j)))
            i = j
        else:
            i += 1
    exchanges = [list(range(a, b)) for a, b in zip(users, users[1:])]
    return rounds + exchanges
