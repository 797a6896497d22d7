"""Sizing rules of one iteration, as pure functions: whether a waiting request fits the cell
budget, how many prompt tokens each prefill gets (adaptive chunking), when prefill waits for
memory. The scheduler (scheduling/scheduler.py) applies them."""

from __future__ import annotations

from agentrt.config import EngineConfig
from agentrt.engine.request import Request


def projected_cells(r: Request) -> int:
    """KV cells (tokens; one per layer each) the request may still add: its uncomputed
    target plus the tokens it may still generate. Reused cells are already resident and are
    not counted twice (the seed counts prompt + max_tokens; sessions would otherwise be
    refused work that fits)."""
    return r.remaining + r.params.max_tokens - len(r.output)


def admissible(candidate: Request, running: list[Request], cfg: EngineConfig) -> bool:
    """Cell-budget admission: admitted requests' projected cells stay under
    cell_budget_fraction of the pool. An idle engine always admits (no starvation)."""
    if not running:
        return True
    budget = cfg.cell_budget_fraction * cfg.num_pages * cfg.page_size
    used = sum(projected_cells(r) for r in running)
    return used + projected_cells(candidate) <= budget


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


def over_high_water(used_pages: int, evictable_pages: int, cfg: EngineConfig) -> bool:
    """Occupancy net of evictable cache above the high-water mark: prefill chunks wait."""
    return (used_pages - evictable_pages) > cfg.high_water * cfg.num_pages
