"""A turn's failed tool calls, so the agent never runs the same failing call twice.

Greedy decoding that reads an error often writes the very call that failed again (the embedded
135M model repeated one call eight times, to the turn's round limit, each with the same error).
`FailedCalls` remembers every call that reached its tool and failed, by (tool name, canonical
arguments). A later identical call in the same turn is not run: it gets an error result saying
so, and a round whose every call was such a repeat ends the turn
(`TurnResult.stopped_by_repeated_failure`), the first failure's message in its tool results.
"""

from __future__ import annotations

import json
from typing import Any

from agentrt.tools import ToolResult


def _key(name: str, arguments: Any) -> tuple[str, str]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return name, arguments
    return name, json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)


class FailedCalls:
    def __init__(self) -> None:
        self._failed: dict[tuple[str, str], str] = {}  # key -> the failure's message
        self._round: dict[int, tuple[str, str]] = {}  # this round's call index -> key
        self._repeats: set[int] = set()  # this round's indices not run (repeats of a failure)

    def start_round(self) -> None:
        self._round, self._repeats = {}, set()

    def check(self, index: int, name: str, arguments: Any, call_id: str) -> ToolResult | None:
        """None: run the call; else the error result of a repeat of a failed call."""
        key = self._round[index] = _key(name, arguments)
        if key not in self._failed:
            return None
        self._repeats.add(index)
        return ToolResult(call_id=call_id, name=name, is_error=True, attempts=0, content=(
            f"not run again: this exact call ({name} with the same arguments) already failed in this turn: "
            f"{self._failed[key]}. Change the arguments, call another tool, or answer without it."))

    def end_round(self, indexed: list[tuple[int, ToolResult]]) -> str | None:
        """Remember the round's failures; the tool name when every call was a repeat of one."""
        for index, r in indexed:
            key = self._round.get(index)
            if key is not None and r.is_error and r.attempts > 0:
                self._failed.setdefault(key, r.content)
        if indexed and all(index in self._repeats for index, _ in indexed):
            return indexed[0][1].name
        return None
