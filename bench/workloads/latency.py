"""Tool latencies drawn from a distribution, per tool, seeded per repetition.

Why: with every tool taking the same fixed time, agents march in lockstep and a KV policy that
keeps "whoever ran last" looks as good as one that knows who comes back when. Real tools vary:
a search takes longer than a lookup, and each call varies around its tool's typical time. So
each tool name gets a fixed scale (0.5x-2x the distribution's median, from a stable hash of the
name, the same in every repetition) and each call a draw from the distribution times that
scale. A call that runs several tools waits for the slowest (they run concurrently).

Distribution specs: "lognormal:MEDIAN:SIGMA" (seconds; sigma of the log), "uniform:LO:HI",
"const:S", "none" (no wait).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import zlib
from dataclasses import dataclass

from bench.workloads.replay import ModelCall

KINDS = {"lognormal": 2, "uniform": 2, "const": 1, "none": 0}


@dataclass(frozen=True)
class LatencyDist:
    """A parsed distribution spec (see the module docstring)."""

    kind: str
    params: tuple[float, ...]

    @classmethod
    def parse(cls, spec: str) -> "LatencyDist":
        kind, *rest = spec.strip().lower().split(":")
        if kind not in KINDS or len(rest) != KINDS[kind]:
            raise ValueError(f"tool latency distribution {spec!r}: want lognormal:MEDIAN:SIGMA, "
                             "uniform:LO:HI, const:S or none")
        params = tuple(float(x) for x in rest)
        if any(not math.isfinite(x) or x < 0 for x in params):
            raise ValueError(f"tool latency distribution {spec!r}: parameters must be finite and >= 0")
        return cls(kind, params)

    def draw(self, rng: random.Random, scale: float = 1.0) -> float:
        """One latency in seconds."""
        if self.kind == "lognormal":
            median, sigma = self.params
            return scale * median * math.exp(rng.gauss(0.0, sigma))
        if self.kind == "uniform":
            return scale * rng.uniform(*self.params)
        return scale * self.params[0] if self.kind == "const" else 0.0

    def __str__(self) -> str:
        return ":".join([self.kind, *(f"{p:g}" for p in self.params)])


def tool_scale(name: str) -> float:
    """A tool's fixed latency scale in [0.5, 2): 2 ** u, u in [-1, 1) from a stable hash."""
    u = (zlib.crc32(name.encode()) % 10_000) / 10_000
    return 2.0 ** (2 * u - 1)


def with_tool_latency(scripts: list[list[ModelCall]], dist: LatencyDist, seed: int) -> list[list[ModelCall]]:
    """`scripts` with every call's tool_latency_s drawn for the tools of the agent's previous
    call (a first call waits on no tool). Same seed, same latencies."""
    rng = random.Random(seed)
    out = []
    for calls in scripts:
        new, prev = [], None
        for c in calls:
            wait = 0.0 if prev is None else max((dist.draw(rng, tool_scale(t)) for t in prev.tools or ("tool",)))
            new.append(dataclasses.replace(c, tool_latency_s=wait))
            prev = c
        out.append(new)
    return out


def latency_stats(scripts: list[list[ModelCall]]) -> dict:
    """Sizes of the tool waits (seconds): count, mean, median, max; {} when no call waits."""
    waits = sorted(c.tool_latency_s for s in scripts for c in s if c.turn > 0)
    if not any(waits):
        return {}
    return {"tool_waits": len(waits), "tool_wait_mean_s": sum(waits) / len(waits),
            "tool_wait_median_s": statistics.median(waits), "tool_wait_max_s": waits[-1]}
