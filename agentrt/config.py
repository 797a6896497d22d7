"""Frozen engine configuration. Defaults are the seed paper's values (DESIGN.md section 2)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrt.cache.base import POLICY_NAMES
from agentrt.errors import ConfigError


@dataclass(frozen=True)
class EngineConfig:
    # KV memory: kv_cache_tokens / page_size pages, allocated once at start
    kv_cache_tokens: int = 32768
    page_size: int = 16
    # sequence pool: transient region (one-shot requests) + session region (agents)
    max_transient_seqs: int = 32
    max_session_seqs: int = 64
    acquire_timeout: float = 30.0
    # admission: projected (prompt + max_tokens) cells of admitted requests <= fraction * pool
    cell_budget_fraction: float = 0.5
    high_water: float = 0.95  # above this occupancy, prefill chunks wait (decode goes on)
    # adaptive chunked prefill: chunk = clamp(n_batch / N, chunk_min, chunk_max)
    n_batch: int = 4096
    chunk_min: int = 128
    chunk_max: int = 4096
    latency_sensitive_max_tokens: int = 32  # a request this short is latency-sensitive
    fair_chunk_cap: int = 1024  # chunk cap while such a request waits under contention
    # prefix-grouped prefill: group by FNV-1a of the next K tokens past the radix match
    prefix_group_k: int = 8
    enable_prefix_grouping: bool = True
    # caches
    enable_radix_cache: bool = True
    enable_session_reuse: bool = True
    eviction_policy: str = "agent_aware"  # radix leaves and idle sessions: "agent_aware" | "lru"
    # (agent_aware learns agent -> next-agent transitions and falls back to LRU when unpredictable)
    debug_invariants: bool = False  # check every cache invariant after every step (tests)
    response_cache_size: int = 256  # full responses kept (0 = off; benchmarks of fresh work)
    # prompt-lookup speculation (greedy and sampled; constrained requests do not speculate)
    enable_speculation: bool = True
    spec_max_draft: int = 8  # draft tokens per slot at most
    spec_token_budget: int = 32  # draft tokens per step shared by all decoders
    spec_min_acceptance: float = 0.3  # below this acceptance rate a slot only probes (1 token)
    spec_min_ngram: int = 1
    spec_max_ngram: int = 3
    # the model's forward: "auto" (the model's own default, fused kernels where available),
    # "fused" or "eager" (the torch reference path)
    forward_path: str = "auto"
    # the tool-call format (agentrt/toolcall/formats.py): "auto" = detected from the chat template,
    # or "hermes" | "qwen" | "llama3" | "mistral"; bare_tool_calls: in tool_choice auto, also take a
    # bare call object / ```json fence at the start of a message (None: the format's default)
    tool_format: str = "auto"
    bare_tool_calls: bool | None = None

    def __post_init__(self) -> None:
        positive = ("kv_cache_tokens", "page_size", "max_transient_seqs", "n_batch",
                    "chunk_min", "chunk_max", "prefix_group_k", "fair_chunk_cap")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_min > self.chunk_max:
            raise ConfigError("EngineConfig.chunk_min must be <= chunk_max")
        if not 0 < self.cell_budget_fraction <= 1 or not 0 < self.high_water <= 1:
            raise ConfigError("cell_budget_fraction and high_water must be in (0, 1]")
        if self.kv_cache_tokens < self.page_size:
            raise ConfigError("kv_cache_tokens must hold at least one page")
        if self.spec_min_ngram < 1 or self.spec_max_ngram < self.spec_min_ngram:
            raise ConfigError("need 1 <= spec_min_ngram <= spec_max_ngram")
        if self.spec_max_draft < 0 or self.spec_token_budget < 0 or self.response_cache_size < 0:
            raise ConfigError("spec_max_draft, spec_token_budget and response_cache_size must be >= 0")
        if self.max_session_seqs < 0:
            raise ConfigError("max_session_seqs must be >= 0")
        if self.forward_path not in ("auto", "fused", "eager"):
            raise ConfigError(f"EngineConfig.forward_path must be 'auto', 'fused' or 'eager', got {self.forward_path!r}")
        if self.tool_format not in ("auto", "hermes", "qwen", "llama3", "mistral"):
            raise ConfigError("EngineConfig.tool_format must be 'auto', 'hermes', 'qwen', 'llama3' or 'mistral', "
                              f"got {self.tool_format!r}")
        if self.bare_tool_calls not in (None, True, False):
            raise ConfigError(f"EngineConfig.bare_tool_calls must be None or a bool, got {self.bare_tool_calls!r}")
        if self.eviction_policy not in POLICY_NAMES:
            raise ConfigError(f"EngineConfig.eviction_policy must be one of {POLICY_NAMES}, "
                              f"got {self.eviction_policy!r}")

    @property
    def num_pages(self) -> int:
        return self.kv_cache_tokens // self.page_size

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def stateless(self) -> "EngineConfig":
        """The same engine with session reuse and the radix cache off (a benchmark baseline)."""
        return self.replace(enable_radix_cache=False, enable_session_reuse=False,
                            enable_prefix_grouping=False, response_cache_size=0)
