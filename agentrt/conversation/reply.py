"""A finished round as clients name it (the server's OpenAI responses, LangChain's chunks): its
calls' ids and its finish reason, one definition for both adapters."""

from __future__ import annotations

from collections.abc import Sequence

from agentrt.fingerprint import fnv1a
from agentrt.conversation.conversation import RoundEnd


def call_prefix(prompt: Sequence[int]) -> str:
    """`call_<12 hex digits>` from the FNV-1a hash of the round's prompt: derived from the prompt,
    so the streamed and the non-streamed request of one prompt name their calls alike."""
    return f"call_{fnv1a(prompt) & 0xFFFFFFFFFFFF:012x}"


def call_id(prefix: str, index: int) -> str:
    """The id of the round's call number `index` (the parser's index)."""
    return f"{prefix}_{index}"


def finish_reason(end: RoundEnd) -> str:
    """OpenAI's finish_reason: "length" when max_tokens cut the round, "tool_calls" when it made
    calls, else "stop" (an early stop by the parser or a stop string included)."""
    return end.api_finish_reason
