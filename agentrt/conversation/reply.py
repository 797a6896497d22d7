"""A finished round as clients name it (the server's OpenAI responses, LangChain's chunks): its
calls' ids and its finish reason, one definition for both adapters."""

from __future__ import annotations

from agentrt.conversation.call_ids import call_id, call_prefix  # (the adapters' names for the one rule)
from agentrt.conversation.conversation import RoundEnd

__all__ = ["call_id", "call_prefix", "finish_reason"]


def finish_reason(end: RoundEnd) -> str:
    """OpenAI's finish_reason: "length" when max_tokens cut the round, "tool_calls" when it made
    calls, else "stop" (an early stop by the parser or a stop string included)."""
    return end.api_finish_reason
