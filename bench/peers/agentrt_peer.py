"""agentrt under test, in three configurations of the same engine and weights:

* full: one `Session` per agent (KV kept across turns) + radix cache + prompt-lookup
  speculation; agents are concurrent tasks, as agentrt is meant to be used;
* stateless: `EngineConfig.stateless()` -- every call prefills its whole prompt;
* prefix_lru: radix cache under LRU eviction, no sessions (transient requests): how vLLM and
  SGLang reuse KV across calls.

Output is force-decoded with `ForcedTokens`, a `constraint=` that allows only the next
scripted token, through the engine's own constrained-decoding path.
"""

from __future__ import annotations

import time
from contextlib import aclosing

import torch

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.cache.base import LRUPolicy
from bench.peers.base import CallRecord, RunResult, drive
from bench.workloads.replay import ModelCall


class ForcedTokens:
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


def engine_counters(eng: Engine) -> dict:
    """The engine's counters relevant to the comparison."""
    st = eng.stats()
    return {"prompt_submitted": st.prompt_submitted, "prompt_cached": st.prompt_cached,
            "prompt_computed": st.prompt_computed, "hit_rate": st.hit_rate,
            "decode_tokens": st.decode_tokens, "steps": st.steps, "preemptions": st.preemptions,
            "evicted_pages": st.evicted_pages, "detached_sessions": st.detached_sessions,
            "spec_proposed": st.spec_proposed, "spec_accepted": st.spec_accepted,
            "spec_acceptance": st.spec_acceptance}


async def forced_call(eng: Engine, c: ModelCall, session=None) -> CallRecord:
    """Submit one scripted call and force-decode its output; its record."""
    t0 = time.perf_counter()
    first, toks, usage = None, [], None
    params = SamplingParams(max_tokens=len(c.output))
    stream = eng.generate(c.prompt, params, session=session, tag=f"agent{c.agent}",
                          constraint=ForcedTokens(c.output))
    async with aclosing(stream) as events:
        async for ev in events:
            if ev.token_ids and first is None:
                first = time.perf_counter()
            toks.extend(ev.token_ids)
            usage = ev.usage or usage
    end = time.perf_counter()
    return CallRecord(c.agent, c.turn, (first or end) - t0, end - t0, len(c.prompt),
                      usage.computed_prompt_tokens if usage else len(c.prompt), len(toks),
                      toks == c.output)


class AgentrtSystem:
    """One agentrt configuration; a fresh engine (empty caches) per run."""

    def __init__(self, name: str, lm, config: EngineConfig, sessions: bool) -> None:
        self.name, self.lm, self.config, self.sessions = name, lm, config, sessions

    @classmethod
    def full(cls, lm, config: EngineConfig) -> "AgentrtSystem":
        return cls("agentrt", lm, config, sessions=True)

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

    async def run(self, scripts, arrival: str) -> RunResult:
        # full: the engine's default (agent-aware) eviction; prefix_lru: LRU, as vLLM/SGLang
        policy = LRUPolicy() if self.name == "agentrt_prefix_lru" else None
        async with Engine(self.lm, self.config, policy=policy) as eng:
            sess = {}
            if self.sessions:
                for s in scripts:
                    sess[s[0].agent] = await eng.open_session(tag=f"agent{s[0].agent}")

            async def call(c: ModelCall) -> CallRecord:
                return await forced_call(eng, c, sess.get(c.agent))

            records, wall = await drive(scripts, arrival, call)
            extra = engine_counters(eng)
            for s in sess.values():
                await s.close()
        return RunResult(self.name, records, wall, extra)
