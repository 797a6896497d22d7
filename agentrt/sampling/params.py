"""Per-request sampling settings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrt.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy. top_k 0 = off. top_p 1.0 = off. seed: None -> derived from the
    prompt (prompt-deterministic sampling), else mixed with it."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)
