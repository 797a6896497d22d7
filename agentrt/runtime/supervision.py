"""Supervision: what happens when an actor's handler raises."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from agentrt.errors import ConfigError


@dataclass(frozen=True)
class Supervision:
    """Restart an actor that crashed, at most `max_restarts` times within `window_s` seconds,
    waiting `backoff_s` (doubling up to `max_backoff_s`) before each restart; past the limit, or
    with strategy "stop", the actor stops. `session` says whether a restarted agent keeps its KV
    session ("keep") or starts from a fresh one ("reset")."""

    strategy: Literal["restart", "stop"] = "restart"
    max_restarts: int = 3
    window_s: float = 60.0
    backoff_s: float = 0.0
    max_backoff_s: float = 5.0
    session: Literal["keep", "reset"] = "keep"

    def __post_init__(self) -> None:
        if self.strategy not in ("restart", "stop"):
            raise ConfigError("Supervision.strategy must be 'restart' or 'stop'")
        if self.session not in ("keep", "reset"):
            raise ConfigError("Supervision.session must be 'keep' or 'reset'")
        if self.max_restarts < 0 or self.window_s <= 0 or self.backoff_s < 0:
            raise ConfigError("Supervision needs max_restarts >= 0, window_s > 0, backoff_s >= 0")


class RestartTracker:
    """Counts restarts in a sliding window; decides restart vs stop and the backoff."""

    def __init__(self, policy: Supervision):
        self.policy = policy
        self._times: deque[float] = deque()
        self.total = 0

    def can_restart(self) -> bool:
        """Whether a crash now would be restarted (next_delay would not be None), without counting it."""
        p = self.policy
        if p.strategy == "stop":
            return False
        now = time.monotonic()
        return sum(1 for t in self._times if now - t <= p.window_s) < p.max_restarts

    def next_delay(self) -> float | None:
        """Delay before the next restart, or None when the actor must stop."""
        p = self.policy
        if p.strategy == "stop":
            return None
        now = time.monotonic()
        while self._times and now - self._times[0] > p.window_s:
            self._times.popleft()
        if len(self._times) >= p.max_restarts:
            return None
        self._times.append(now)
        self.total += 1
        return min(p.backoff_s * 2 ** (len(self._times) - 1), p.max_backoff_s)
