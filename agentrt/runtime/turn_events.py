"""What an agent turn yields while streaming, and what it returns at the end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrt.records.request import Usage
from agentrt.toolcall import ArgumentsDelta, CallComplete, CallInvalid, CallStarted, TextDelta

__all__ = ["ArgumentsDelta", "CallComplete", "CallInvalid", "CallStarted", "TextDelta",
           "ToolResultEvent", "TurnResult", "RoundStarted"]


@dataclass(frozen=True)
class RoundStarted:
    """A model call begins (round 0 answers the message; later rounds follow tool results)."""

    round: int
    prompt_tokens: int


@dataclass(frozen=True)
class ToolResultEvent:
    """A tool call finished (successfully or not); `result` is a tools.ToolResult."""

    result: Any


@dataclass(frozen=True)
class TurnResult:
    """The end of an agent turn: the final text and every message the turn added."""

    text: str
    messages: list[dict] = field(default_factory=list)  # assistant + tool messages, in order
    tool_results: list[Any] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)  # one per model call
    rounds: int = 0
    stopped_by_round_limit: bool = False
    stopped_by_tool: str | None = None  # a tool in the agent's stop_at_tools ended the turn
    # a round that only repeated calls which had failed ended the turn (runtime/failed_calls.py)
    stopped_by_repeated_failure: str | None = None
