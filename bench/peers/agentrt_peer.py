"""agentrt under test, in four configurations of the same engine and weights:

* full: one `Session` per agent (KV kept across turns) + radix cache + prompt-lookup
  speculation + the KV memory hierarchy (a second KV tier in host RAM with promotion and
  prefetch, tool-aware TTL pins: after each call that ends in tool calls the agent tells the
  engine which tools it now waits on); agents are concurrent tasks, as agentrt is meant to be used;
* no_tier: the same without the second tier (what sessions + TTL pins do on the pool alone);
* stateless: `EngineConfig.stateless()` -- every call prefills its whole prompt;
* prefix_lru: radix cache under LRU eviction, no sessions, no tier (transient requests): how
  vLLM and SGLang reuse KV across calls.

The hierarchy's knobs (`kv_tier_bytes`, `enable_prefetch`, `tool_ttl`) and `Session.expect_tools`
are used only where this engine has them (`with_known`, hasattr), so the benchmark runs on
engines from before the hierarchy too; each run records which knobs applied (`tier_knobs`).

Output is force-decoded with `ForcedTokens`, a `constraint=` that allows only the next
scripted token, through the engine's own constrained-decoding path.
"""

from __future__ import annotations

import dataclasses
from contextlib import aclosing

import anyio
import torch

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.kv.eviction import LRUPolicy
from agentrt.records.constraint import LogitsConstraint
from bench.peers.base import CallRecord, RunResult, drive
from bench.workloads.replay import ModelCall


class ForcedTokens(LogitsConstraint):
    """A logits constraint that makes greedy decoding emit exactly `script`.

    Speculative drafts are not cut to the script (`accepts_prefix` accepts the whole draft):
    the model verifies them under this mask, so a wrong draft token costs its forward as it
    would if the model had produced the script itself."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.pos = 0

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.pos >= len(self.script):
            return logits
        tok = self.script[self.pos]
        out = torch.full_like(logits, float("-inf"))
        out[tok] = logits[tok]
        return out

    def advance(self, token: int) -> None:
        self.pos += 1

    def is_terminated(self) -> bool:
        return self.pos >= len(self.script)

    def accepts_prefix(self, draft: list[int]) -> int:
        return min(len(draft), len(self.script) - self.pos)


TIER_BYTES = 4 << 30  # the full system's second KV tier: generous, so the pool is the limit
# the hierarchy's knobs per system (only those the engine's EngineConfig has are applied);
# no_tier keeps TTL pins but has no tier to prefetch from
HIERARCHY = {
    "agentrt": {"kv_tier_bytes": TIER_BYTES, "enable_prefetch": True, "tool_ttl": True},
    "agentrt_no_tier": {"kv_tier_bytes": 0, "enable_prefetch": False, "tool_ttl": True},
    "agentrt_stateless": {"kv_tier_bytes": 0, "enable_prefetch": False, "tool_ttl": False},
    "agentrt_prefix_lru": {"kv_tier_bytes": 0, "enable_prefetch": False, "tool_ttl": False},
}
# EngineStats fields of the memory hierarchy, recorded where the engine has them
TIER_COUNTERS = ("prompt_promoted", "demoted_pages", "promoted_pages", "prefetched_pages", "prefetch_used_pages",
                 "prefetch_used_fraction", "prefetch_saved_s", "return_prefetched_pages",
                 "return_prefetch_used_pages", "tier_pages",
                 "tier_bytes", "ttl_pins", "ttl_hits", "ttl_expired", "tool_ttls")


def with_known(cfg: EngineConfig, **changes) -> EngineConfig:
    """`cfg` with those of `changes` that are EngineConfig fields (the others are skipped, so a
    knob the engine does not have yet is simply off)."""
    names = {f.name for f in dataclasses.fields(cfg)}
    return cfg.replace(**{k: v for k, v in changes.items() if k in names})


def applied_knobs(cfg: EngineConfig, name: str) -> dict:
    """The hierarchy knobs of system `name` that this engine's config has, with their values."""
    return {k: getattr(cfg, k) for k in HIERARCHY.get(name, {}) if hasattr(cfg, k)}


def engine_counters(eng: Engine) -> dict:
    """The engine's counters relevant to the comparison (the hierarchy's where they exist)."""
    st = eng.stats()
    out = {"prompt_submitted": st.prompt_submitted, "prompt_cached": st.prompt_cached,
           "prompt_computed": st.prompt_computed, "hit_rate": st.hit_rate,
           "decode_tokens": st.decode_tokens, "steps": st.steps, "preemptions": st.preemptions,
           "evicted_pages": st.evicted_pages, "detached_sessions": st.detached_sessions,
           "spec_proposed": st.spec_proposed, "spec_accepted": st.spec_accepted,
           "spec_acceptance": st.spec_acceptance}
    for k in TIER_COUNTERS:
        if hasattr(st, k):
            v = getattr(st, k)
            out[k] = dict(v) if isinstance(v, dict) else v
    return out


async def forced_call(eng: Engine, c: ModelCall, session=None, adapter: str | None = None) -> CallRecord:
    """Submit one scripted call and force-decode its output (under LoRA `adapter`); its record."""
    t0 = anyio.current_time()  # (the event loop's clock: virtual in a simulated run)
    first, toks, usage = None, [], None
    params = SamplingParams(max_tokens=len(c.output))
    stream = eng.generate(c.prompt, params, session=session, tag=f"agent{c.agent}",
                          constraint=ForcedTokens(c.output), **({"adapter": adapter} if adapter else {}))
    async with aclosing(stream) as events:
        async for ev in events:
            if ev.token_ids and first is None:
                first = anyio.current_time()
            toks.extend(ev.token_ids)
            usage = ev.usage or usage
    end = anyio.current_time()
    return CallRecord(c.agent, c.turn, (first or end) - t0, end - t0, len(c.prompt),
                      usage.computed_prompt_tokens if usage else len(c.prompt), len(toks),
                      toks == c.output)


class AgentrtSystem:
    """One agentrt configuration; a fresh engine (empty caches) per run. `hints`: after each
    call but an agent's last, tell the engine the tools the agent now waits on."""

    def __init__(self, name: str, lm, config: EngineConfig, sessions: bool, hints: bool = False) -> None:
        self.name, self.lm, self.sessions, self.hints = name, lm, sessions, hints
        self.config = with_known(config, **HIERARCHY.get(name, {}))

    @classmethod
    def full(cls, lm, config: EngineConfig) -> "AgentrtSystem":
        return cls("agentrt", lm, config, sessions=True, hints=True)

    @classmethod
    def no_tier(cls, lm, config: EngineConfig) -> "AgentrtSystem":
        return cls("agentrt_no_tier", lm, config, sessions=True, hints=True)

    @classmethod
    def stateless(cls, lm, config: EngineConfig) -> "AgentrtSystem":
        return cls("agentrt_stateless", lm, config.stateless(), sessions=False)

    @classmethod
    def prefix_lru(cls, lm, config: EngineConfig) -> "AgentrtSystem":
        cfg = config.replace(enable_radix_cache=True, enable_session_reuse=False)
        return cls("agentrt_prefix_lru", lm, cfg, sessions=False)

    async def warmup(self) -> None:
        """One short call through a throwaway engine (first-call allocations off the clock)."""
        async with Engine(self.lm, self.config.replace(kv_cache_tokens=4096)) as eng:
            await eng.complete(list(range(100, 164)), SamplingParams(max_tokens=4, ignore_eos=True))

    async def run(self, scripts, arrival: str, executor=None) -> RunResult:
        """`executor`: a simulated one (agentrt.sim; run under agentrt.sim.run) instead of the model."""
        # full: the engine's default (agent-aware) eviction; prefix_lru: LRU, as vLLM/SGLang
        policy = LRUPolicy() if self.name == "agentrt_prefix_lru" else None
        last = {s[-1].agent: s[-1].turn for s in scripts if s}
        # scripts built by ScriptBuilder name each call's tools (a final answer before the next
        # user message waits on no tool: no hint); hand-built ones without names hint "tool"
        named = any(c.tools for s in scripts for c in s)
        hints = 0
        async with Engine(self.lm, self.config, policy=policy, executor=executor) as eng:
            sess = {}
            if self.sessions:
                for s in scripts:
                    sess[s[0].agent] = await eng.open_session(tag=f"agent{s[0].agent}")

            async def call(c: ModelCall) -> CallRecord:
                nonlocal hints
                s = sess.get(c.agent)
                rec = await forced_call(eng, c, s)
                tools = list(c.tools) if named else ["tool"]
                if self.hints and tools and c.turn < last[c.agent] and hasattr(s, "expect_tools"):
                    await s.expect_tools(tools)
                    hints += 1
                return rec

            records, wall = await drive(scripts, arrival, call)
            extra = {**engine_counters(eng), "tier_knobs": applied_knobs(self.config, self.name),
                     "tool_hints": hints}
            for s in sess.values():
                await s.close()
        return RunResult(self.name, records, wall, extra)
