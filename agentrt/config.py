"""Frozen engine configuration. Defaults are the seed paper's values (docs/design.md section 2)."""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

from agentrt.checks import check_bool, check_choice, check_float, check_int, set_frozen
from agentrt.errors import ConfigError
from agentrt.policy_names import EVICTION_POLICIES, SCHEDULING_POLICIES


@dataclass(frozen=True)
class EngineConfig:
    # KV memory: kv_cache_tokens / page_size pages, allocated once at start
    kv_cache_tokens: int = 32768
    page_size: int = 16
    # sliding-window layers (Gemma, Mistral) keep their own pool, released as sequences slide
    # past (kv/window.py): its size in tokens (0 = a batch's prefill plus 8 windows); the bytes
    # it saves go to the other layers' whole history
    window_kv_tokens: int = 0
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
    # the second KV tier (kv/tier.py): bytes of demoted pages kept (0 = off: evicted pages are
    # dropped and recomputed); prefetch promotes the predicted next agents' pages between steps
    kv_tier_bytes: int = 2 << 30
    enable_prefetch: bool = True
    # ... the first of which is the return prefetch (engine/prefetch.py): a session waiting on
    # tools whose history pressure cut is brought back when they are due, and held for them
    enable_return_prefetch: bool = True
    # tool-aware retention (kv/retention.py): a session whose turn ended in tool calls keeps
    # its KV for a TTL from the tools' observed durations and the reload cost, at most this long
    tool_ttl: bool = True
    tool_ttl_max_s: float = 30.0
    # workflow-aware scheduling (scheduling/policies.py): which ready requests are admitted and which
    # agents' prefixes stay resident: "fcfs" (arrival order) | "lpm" (longest resident prefix
    # first) | "srpt" (task with the least remaining work first) | "program_fcfs" (oldest task
    # first) | "topas" (seed 004: joint prefix residency + admission over the task DAG)
    scheduling_policy: str = "fcfs"
    task_aging_s: float = 10.0  # topas: a task this old gains as much priority as one stage's work
    topas_exhaustive_agents: int = 6  # topas: subsets of at most this many agents are enumerated
    # topas, measured options (off: scheduling/topas.py): "locality" | "age" fill order inside a
    # chosen agent set, and leaving a stage for the oldest task's once it has this many full batches
    topas_admission: str = "locality"
    topas_switch_full: float = 0.0
    # the per-decision trace (scheduling/trace.py): the last N scheduling decisions with their
    # candidates, score terms, resident prefixes and evictions (0 = off; Engine.decision_trace())
    decision_trace: int = 0
    debug_invariants: bool = False  # check every cache invariant after every step (tests)
    response_cache_size: int = 256  # full responses kept (0 = off; benchmarks of fresh work)
    # prompt-lookup speculation (greedy and sampled; constrained requests do not speculate)
    enable_speculation: bool = True
    spec_max_draft: int = 8  # draft tokens per slot at most
    spec_token_budget: int = 32  # draft tokens per step shared by all decoders
    spec_min_acceptance: float = 0.3  # below this acceptance rate a slot only probes (1 token)
    spec_min_ngram: int = 1
    spec_max_ngram: int = 3
    # fast-forward over text a request's grammar forces (constrain/forcing.py): its canonical ids
    # are appended after the sampled token and fed in one chunk, not one decode step each
    grammar_fast_forward: bool = True
    # fill the step's grammar masks in a worker thread while the model's forward runs
    grammar_overlap: bool = True
    # the model's forward: "auto" (the model's own default, fused kernels where available),
    # "fused" or "eager" (the torch reference path)
    forward_path: str = "auto"
    # on a GPU: replay steps of short rows (decode, verification, fast-forward) as CUDA graphs, one
    # per token bucket (model/graphs.py); False runs every step eagerly (vLLM's enforce_eager)
    cuda_graphs: bool = True
    # the tool-call format (agentrt/toolcall/formats.py): "auto" = detected from the chat template,
    # or "hermes" | "qwen" | "llama3" | "mistral" | "phi4" | "gemma"; bare_tool_calls: in tool_choice auto, also take a
    # bare call object / ```json fence at the start of a message (None: the format's default)
    tool_format: str = "auto"
    bare_tool_calls: bool | None = None
    # durable state (agentrt/state, kv/disk.py): `state_dir` keeps the state store (SQLite,
    # state.db) and the disk KV tier's records, so a restarted engine gets its sessions' KV back;
    # `state_url` (postgresql://...) keeps the store in PostgreSQL instead, shared by replicas
    # (KV records still under state_dir, when given); the disk tier holds at most disk_budget_bytes
    state_dir: str | None = None
    state_url: str | None = None
    disk_budget_bytes: int = 16 << 30

    def __post_init__(self) -> None:
        put = functools.partial(set_frozen, self)

        # types and ranges first, field by field (ints are ints, floats finite, bools bools)
        for name, least in _INTS.items():
            put(name, check_int(f"EngineConfig.{name}", getattr(self, name), min=least))
        for name, (lo, hi, lo_open) in _FRACTIONS.items():
            put(name, check_float(f"EngineConfig.{name}", getattr(self, name), min=lo, max=hi, min_open=lo_open))
        put("acquire_timeout", check_float("EngineConfig.acquire_timeout (seconds)", self.acquire_timeout,
                                           min=0.0))
        put("tool_ttl_max_s", check_float("EngineConfig.tool_ttl_max_s (seconds)", self.tool_ttl_max_s, min=0.0))
        for name in _BOOLS:
            put(name, check_bool(f"EngineConfig.{name}", getattr(self, name)))
        if self.bare_tool_calls is not None:
            check_bool("EngineConfig.bare_tool_calls (None: the format's default)", self.bare_tool_calls)
        for name in ("state_dir", "state_url"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
                raise ConfigError(f"EngineConfig.{name} must be a path (state_dir) or URL (state_url) string, or "
                                  f"None, got {value!r}")
            if value is not None:
                put(name, os.fspath(value))
        if self.state_url is not None and not self.state_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("EngineConfig.state_url must be a postgresql:// URL (SQLite needs none: give "
                              f"state_dir alone), got {self.state_url.split('@')[-1]!r}")
        check_choice("EngineConfig.forward_path", self.forward_path, ("auto", "fused", "eager"))
        check_choice("EngineConfig.tool_format", self.tool_format,
                     ("auto", "hermes", "qwen", "llama3", "mistral", "phi4", "gemma"))
        check_choice("EngineConfig.eviction_policy", self.eviction_policy, EVICTION_POLICIES)
        check_choice("EngineConfig.scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        put("task_aging_s", check_float("EngineConfig.task_aging_s (seconds)", self.task_aging_s, min=0.0,
                                        min_open=True))
        check_choice("EngineConfig.topas_admission", self.topas_admission, ("locality", "age"))
        put("topas_switch_full", check_float("EngineConfig.topas_switch_full (full batches; 0 = off)",
                                             self.topas_switch_full, min=0.0))
        # relations between fields
        if self.chunk_min > self.chunk_max:
            raise ConfigError(f"EngineConfig.chunk_min ({self.chunk_min}) must be <= chunk_max ({self.chunk_max})")
        if self.kv_cache_tokens < self.page_size:
            raise ConfigError(f"EngineConfig.kv_cache_tokens ({self.kv_cache_tokens}) must hold at least one "
                              f"page of page_size={self.page_size} tokens")
        if self.spec_max_ngram < self.spec_min_ngram:
            raise ConfigError(f"need 1 <= spec_min_ngram <= spec_max_ngram, got {self.spec_min_ngram} and "
                              f"{self.spec_max_ngram}")

    @property
    def num_pages(self) -> int:
        return self.kv_cache_tokens // self.page_size

    def replace(self, **changes) -> "EngineConfig":
        return dataclasses.replace(self, **changes)

    def stateless(self) -> "EngineConfig":
        """The same engine with session reuse and the radix cache off (a benchmark baseline)."""
        return self.replace(enable_radix_cache=False, enable_session_reuse=False,
                            enable_prefix_grouping=False, response_cache_size=0, kv_tier_bytes=0, state_dir=None,
                            state_url=None)


# int fields and their minimum
_INTS = {"kv_cache_tokens": 1, "window_kv_tokens": 0, "page_size": 1, "max_transient_seqs": 1, "max_session_seqs": 0, "n_batch": 1,
         "chunk_min": 1, "chunk_max": 1, "latency_sensitive_max_tokens": 0, "fair_chunk_cap": 1,
         "prefix_group_k": 1, "response_cache_size": 0, "spec_max_draft": 0, "spec_token_budget": 0,
         "spec_min_ngram": 1, "spec_max_ngram": 1, "kv_tier_bytes": 0, "topas_exhaustive_agents": 1,
         "decision_trace": 0, "disk_budget_bytes": 0}
# float fields: (min, max, min excluded)
_FRACTIONS = {"cell_budget_fraction": (0.0, 1.0, True), "high_water": (0.0, 1.0, True),
              "spec_min_acceptance": (0.0, 1.0, False)}
_BOOLS = ("cuda_graphs", "enable_prefix_grouping", "enable_radix_cache", "enable_session_reuse", "debug_invariants",
          "enable_speculation", "enable_prefetch", "enable_return_prefetch", "tool_ttl", "grammar_fast_forward",
          "grammar_overlap")
