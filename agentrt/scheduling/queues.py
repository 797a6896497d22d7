"""The scheduler's request queues (scheduling/scheduler.py owns them): waiting in arrival order
(a preempted request goes back to the head), running in admission order."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from agentrt.records.request import Request


@dataclass
class Queues:
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Request] = field(default_factory=list)

    def queued_sessions(self) -> set[int]:
        """ids of the sessions whose request waits, not attached yet (it holds nothing it needs)."""
        return {id(r.session) for r in self.waiting if r.session is not None and not r.attached}
