"""Per-turn timelines for observers (the dashboard): where each of the last N turns spent its time.

A turn is laid out as segments on the event loop's monotonic clock: for each generation round
its queue wait, prefill and decode (the engine's numbers, `Usage.queue_wait_s`, `prefill_s`,
`decode_s`, placed from the round's start), then the round's tool calls (from the round's end to
the last result). Agents record their turns (runtime/agent.py), the server its requests. The log
is one bounded deque per engine (`timeline_of(engine)`, kept in `engine.shared`): recording is an
append per turn on the event loop, never work in the engine's step thread.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

KEEP_TURNS = 200  # turns a log keeps (the oldest dropped beyond)


@dataclass(frozen=True)
class Segment:
    kind: str  # "queue" | "prefill" | "decode" | "tool"
    start: float  # time.monotonic() seconds
    end: float


@dataclass(frozen=True)
class TurnRecord:
    seq: int  # the log's running number (a reader asks for those after the last it saw)
    agent: str
    task: str | None
    start: float
    end: float
    segments: tuple[Segment, ...]
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self, origin: float = 0.0) -> dict:
        """JSON-ready, times in seconds after `origin`."""
        return {"seq": self.seq, "agent": self.agent, "task": self.task, "start": self.start - origin,
                "end": self.end - origin, "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens,
                "segments": [[s.kind, s.start - origin, s.end - origin] for s in self.segments]}


class TurnLog:
    """The last `keep` turns (a bounded deque; appended to on the event loop, read from anywhere)."""

    def __init__(self, keep: int = KEEP_TURNS) -> None:
        self.turns: deque[TurnRecord] = deque(maxlen=keep)
        self._seq = itertools.count(1)

    def add(self, builder: "TurnBuilder") -> TurnRecord:
        rec = builder.record(next(self._seq))
        self.turns.append(rec)
        return rec

    def recent(self, n: int | None = None) -> list[TurnRecord]:
        turns = list(self.turns)  # (a copy first: another thread may append meanwhile)
        return turns if n is None else turns[-n:]


class TurnBuilder:
    """One turn's segments as it runs: `round(...)` per generation round, `tools(...)` per tool phase."""

    def __init__(self, agent: str, task: str | None = None) -> None:
        self.agent, self.task = agent, task
        self.start = now()
        self.segments: list[Segment] = []
        self.tokens = [0, 0, 0]  # prompt, cached, completion

    def round(self, started: float, ended: float, usage: Any) -> None:
        """A round that ran from `started` to `ended` (now() values) with the engine's `usage`."""
        if usage is None:
            self.segments.append(Segment("decode", started, ended))
            return
        t = started
        for kind, dt in (("queue", usage.queue_wait_s), ("prefill", usage.prefill_s)):
            if dt > 0:
                self.segments.append(Segment(kind, t, min(ended, t + dt)))
                t = min(ended, t + dt)
        self.segments.append(Segment("decode", t, ended))
        self.tokens[0] += usage.prompt_tokens
        self.tokens[1] += usage.cached_tokens
        self.tokens[2] += usage.completion_tokens

    def tools(self, started: float, ended: float) -> None:
        self.segments.append(Segment("tool", started, ended))

    def record(self, seq: int) -> TurnRecord:
        return TurnRecord(seq, self.agent, self.task, self.start, now(), tuple(self.segments), *self.tokens)


def now() -> float:
    """The timeline's clock."""
    return time.monotonic()


def timeline_of(engine: Any) -> TurnLog:
    """The engine's turn log (an Engine's, or a Ray RemoteEngine's), created on first use."""
    if engine.shared.timeline is None:
        engine.shared.timeline = TurnLog()
    return engine.shared.timeline
