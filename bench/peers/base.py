"""What every system under test shares: call records, run results, and the arrival driver.

A system is an object with `name` and `async run(scripts, arrival) -> RunResult`. The driver
`drive()` replays the agents' scripts: each call is submitted after the agent's previous call
ended and its tool latency passed. Arrival "concurrent": agents run independently. Arrival
"interleaved": a turn barrier -- turn t of every agent starts after turn t-1 of all agents, and
is submitted in agent order (A1 B1 C1 A2 B2 C2 ...). Systems that run one call at a time (the
peers) serialise calls through `SerialModel`, in submission order (anyio's Lock is FIFO).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from bench.workloads.replay import ModelCall

ARRIVALS = ("interleaved", "concurrent")


@dataclass(frozen=True)
class CallRecord:
    """What one model call cost. ttft_s: submission to first output token (queueing included);
    total_s: submission to last token. computed_prompt_tokens: prompt tokens actually prefilled."""

    agent: int
    turn: int
    ttft_s: float
    total_s: float
    prompt_tokens: int
    computed_prompt_tokens: int
    output_tokens: int
    exact: bool  # the decoded tokens equal the script's output


@dataclass
class RunResult:
    """One system's run of one workload."""

    system: str
    records: list[CallRecord]
    wall_s: float
    extra: dict = field(default_factory=dict)  # system-specific counters (engine stats ...)


@dataclass(frozen=True)
class NotRun:
    """A system that could not run, and why (reported, never dropped)."""

    system: str
    reason: str


CallFn = Callable[[ModelCall], Awaitable[CallRecord]]


async def drive(scripts: Sequence[Sequence[ModelCall]], arrival: str, call: CallFn) -> tuple[list[CallRecord], float]:
    """Replay `scripts` through `call`; (records in completion order, wall seconds)."""
    if arrival not in ARRIVALS:
        raise ValueError(f"arrival must be one of {ARRIVALS}, got {arrival!r}")
    records: list[CallRecord] = []

    async def one(c: ModelCall) -> None:
        if c.tool_latency_s > 0:
            await anyio.sleep(c.tool_latency_s)
        records.append(await call(c))

    async def agent(calls: Sequence[ModelCall]) -> None:
        for c in calls:
            await one(c)

    t0 = anyio.current_time()  # (the event loop's clock: virtual in a simulated run)
    if arrival == "interleaved":
        for t in range(max((len(s) for s in scripts), default=0)):
            async with anyio.create_task_group() as tg:
                for s in scripts:
                    if t < len(s):
                        tg.start_soon(one, s[t])
                        await anyio.sleep(0)  # let it submit before the next agent's call
    else:
        async with anyio.create_task_group() as tg:
            for s in scripts:
                tg.start_soon(agent, s)
    return records, anyio.current_time() - t0


class SerialModel:
    """Runs a blocking `fn(call, t_submit) -> CallRecord` one call at a time, in submission
    order, in a worker thread (the event loop stays free for tool-latency timers)."""

    def __init__(self, fn: Callable[[ModelCall, float], CallRecord]) -> None:
        self._fn = fn
        self._lock = anyio.Lock()

    async def __call__(self, c: ModelCall) -> CallRecord:
        t_submit = time.perf_counter()
        async with self._lock:
            return await anyio.to_thread.run_sync(self._fn, c, t_submit)


def forced_token(logits, token: int) -> int:
    """The token a constraint allowing only `token` picks from `logits` (a 1-D numpy array or
    torch tensor): the masked argmax, done for real so peers pay what agentrt's mask pays."""
    masked = logits.clone() if hasattr(logits, "clone") else logits.copy()
    masked[:] = float("-inf")
    masked[token] = logits[token]
    return int(masked.argmax())
