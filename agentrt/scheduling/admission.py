"""Sizing rules of one iteration, as pure functions: whether a waiting request fits the cell
budget (`Footprint`), how many prompt tokens each prefill gets (adaptive chunking). The scheduler
(scheduling/scheduler.py) applies them; when prefill waits for memory is the KV room's rule
(kv/memory.py::over_high_water)."""

from __future__ import annotations

from typing import NamedTuple

from agentrt.config import EngineConfig
from agentrt.records.request import Request


class StepSizes(NamedTuple):
    """A step's token budget and a prefill chunk's cap (EngineConfig.n_batch / chunk_max; the
    scheduler's own, halved after a device out-of-memory)."""

    n_batch: int
    chunk_max: int


def projected_cells(r: Request) -> int:
    """KV cells (tokens; one per layer each) the request may still add: its uncomputed
    target plus the tokens it may still generate. Reused cells are already resident and are
    not counted twice (the seed counts prompt + max_tokens; sessions would otherwise be
    refused work that fits)."""
    return r.remaining + r.params.max_tokens - len(r.output)


def is_latency_sensitive(r: Request, cfg: EngineConfig) -> bool:
    return r.params.max_tokens <= cfg.latency_sensitive_max_tokens


def chunk_size(prefills: list[Request], decodes: list[Request], cfg: EngineConfig) -> int:
    """clamp(n_batch / N, chunk_min, chunk_max) for N requests with prefill work; under
    contention with a latency-sensitive request present, at most fair_chunk_cap."""
    n = max(len(prefills), 1)
    chunk = max(cfg.chunk_min, min(cfg.chunk_max, cfg.n_batch // n))
    contended = len(prefills) + len(decodes) > 1
    if contended and any(is_latency_sensitive(r, cfg) for r in prefills + decodes):
        chunk = min(chunk, cfg.fair_chunk_cap)
    return chunk


class Footprint:
    """The running requests' KV during one admission pass, kept as requests are admitted, so a
    candidate costs its own pages rather than a walk of every running request:
    * cells: their projected cells (the cell budget, `admissible`);
    * held: the pages they hold, shared ones once, and new: the pages their cells to come need,
      +1 each for a shared partial page's copy (the footprint check, `fits`: without it,
      requests that cannot run together are admitted and preempt each other over and over).
    An idle engine always admits (no starvation). A request preempted before is admitted again
    only alone: every request admitted after it is younger, so it is never the victim again and
    preemption cannot loop (one that cannot fit alone fails at once: OutOfKVMemory)."""

    def __init__(self, running: list[Request], cfg: EngineConfig):
        self.cfg, self.n, self.cells, self.new = cfg, 0, 0, 0
        self.held: set[int] = set()  # pages the admitted requests hold
        for r in running:
            self.add(r)

    def _new_pages(self, r: Request) -> int:
        return -(-projected_cells(r) // self.cfg.page_size) + 1

    def admissible(self, r: Request) -> bool:
        cfg = self.cfg
        return not self.n or self.cells + projected_cells(r) <= cfg.cell_budget_fraction * cfg.num_pages * cfg.page_size

    def fits(self, r: Request) -> bool:
        if not self.n:
            return True
        if r.preemptions:
            return False
        extra = len({p for p in r.seq.pages if p not in self.held})
        return len(self.held) + extra + self.new + self._new_pages(r) <= self.cfg.high_water * self.cfg.num_pages

    def add(self, r: Request) -> None:
        """r was admitted."""
        self.n += 1
        self.cells += projected_cells(r)
        self.held.update(r.seq.pages)
        self.new += self._new_pages(r)
