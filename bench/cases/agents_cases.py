"""Cases of bench/bench_agents.py: the workloads (quick and full sizes), the systems each case
compares, and the factory that builds each system once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from agentrt import EngineConfig
from agentrt.prefixes import common_prefix
from bench.peers.agentrt_peer import AgentrtSystem
from bench.peers.base import NotRun
from bench.workloads.replay import ModelCall, bfcl_script, check_script
from bench.workloads.synthetic_agents import SyntheticSpec, synthetic_scripts

AGENTRT = ("agentrt", "agentrt_stateless", "agentrt_prefix_lru", "agentrt_no_tier")
PEERS = ("transformers", "llamacpp_shared", "llamacpp_per_agent")
SYSTEMS = AGENTRT + PEERS
# the cases from before the memory hierarchy compare these (agentrt_no_tier is for mem* cases)
CLASSIC = tuple(s for s in SYSTEMS if s != "agentrt_no_tier")
PAGE = 16

# synthetic sizes (tokens). Full: the sizes; quick: small deltas so --quick takes minutes
# on a 2-core CPU (35 turns are kept: the quadratic stateless cost is the point).
FULL = {
    "turns6": SyntheticSpec(agents=4, turns=6),
    "turns35": SyntheticSpec(agents=1, turns=35, result_tokens=(70, 120)),
    "agents8": SyntheticSpec(agents=8, turns=6),
}
QUICK = {
    "turns6": SyntheticSpec(agents=2, turns=6, anchor_tokens=150, user_tokens=30, result_tokens=(20, 40),
                            n_tools=1, max_args=1),
    "turns35": SyntheticSpec(agents=1, turns=35, anchor_tokens=150, user_tokens=20, result_tokens=(4, 8),
                             n_tools=1, max_args=0, json_results=False),
    "agents8": SyntheticSpec(agents=8, turns=4, anchor_tokens=150, user_tokens=20, result_tokens=(8, 16),
                             n_tools=1, max_args=0),
}
BFCL_FULL = {"n": 8, "max_turns": None, "pool": 8}
BFCL_QUICK = {"n": 2, "max_turns": 1, "pool": 16}  # the 2 entries with the shortest prompts of 16
SMALL_POOL_FRACTION = 0.6
SWEEP_AGENTS = (1, 4, 8, 16)


@dataclass(frozen=True)
class Case:
    """One workload and the systems run on it. `make(rep)` gives the scripts of repetition rep
    (seeded by rep). `pool_fraction`: the KV pool is this fraction of the agents' final
    histories, shared prefixes counted once (None: room for all of them)."""

    key: str
    title: str
    systems: tuple[str, ...]
    arrival: str
    make: Callable[[int], list[list[ModelCall]]]
    pool_fraction: float | None = None


def _synthetic(fmt, tok, spec: SyntheticSpec) -> Callable[[int], list[list[ModelCall]]]:
    return lambda rep: synthetic_scripts(fmt, tok, dataclasses.replace(spec, seed=spec.seed + rep))


def _bfcl(fmt, n: int, max_turns: int | None, pool: int, latency: float) -> Callable[[int], list[list[ModelCall]]]:
    """BFCL entries as agents: `pool` entries drawn with seed rep, the `n` with the shortest
    first prompts kept (all of them when pool == n)."""
    def make(rep: int) -> list[list[ModelCall]]:
        from bench.workloads.bfcl import load_bfcl

        drawn = [bfcl_script(fmt, 0, e, latency) for e in load_bfcl(pool, seed=rep, max_turns=max_turns)]
        kept = sorted(drawn, key=lambda s: len(s[0].prompt))[:n] if pool > n else drawn
        scripts = [[dataclasses.replace(c, agent=i) for c in s] for i, s in enumerate(kept)]
        for s in scripts:
            check_script(s, 8192)
        return scripts
    return make


def build_cases(fmt, tok, *, quick: bool, tool_latency: float = 0.0, distinct: bool = False,
                arrival: str | None = None, sweep: bool = False) -> list[Case]:
    """The benchmark's cases, in run order."""
    sizes = QUICK if quick else FULL
    spec = {k: dataclasses.replace(v, tool_latency_s=tool_latency, shared_system=not distinct)
            for k, v in sizes.items()}
    pair = ("agentrt", "agentrt_stateless")
    six = pair if quick else CLASSIC
    # one agent: a shared Llama is a per-agent one; transformers would re-prefill ~150k tokens
    long = pair if quick else pair + ("agentrt_prefix_lru", "llamacpp_per_agent")
    bfcl = BFCL_QUICK if quick else BFCL_FULL
    a8 = spec["agents8"]
    cases = [
        Case("turns6", f"{spec['turns6'].agents} agents x 6 turns", six, arrival or "concurrent",
             _synthetic(fmt, tok, spec["turns6"])),
        Case("turns35", f"{spec['turns35'].agents} agent x 35 turns", long, arrival or "concurrent",
             _synthetic(fmt, tok, spec["turns35"])),
        Case("agents8", f"8 agents x {a8.turns} turns", CLASSIC, arrival or "interleaved",
             _synthetic(fmt, tok, a8)),
        Case("agents8_small_pool", f"8 agents x {a8.turns} turns, KV pool "
             f"{SMALL_POOL_FRACTION:.0%} of their histories", ("agentrt", "agentrt_prefix_lru"),
             arrival or "interleaved", _synthetic(fmt, tok, a8), SMALL_POOL_FRACTION),
        Case("bfcl", f"BFCL v4 multi_turn_base, {bfcl['n']} entries"
             + (f", first {bfcl['max_turns']} turn(s)" if bfcl["max_turns"] else ""),
             ("agentrt", "llamacpp_per_agent") + (() if quick else ("agentrt_prefix_lru",)),
             arrival or "concurrent", _bfcl(fmt, bfcl["n"], bfcl["max_turns"], bfcl["pool"], tool_latency)),
    ]
    if sweep:
        for a in SWEEP_AGENTS:
            s = dataclasses.replace(spec["turns6"], agents=a)
            cases.append(Case(f"sweep{a}", f"sweep: {a} agents x 6 turns", ("agentrt", "agentrt_stateless"),
                              arrival or "concurrent", _synthetic(fmt, tok, s)))
    return cases


def unique_tokens(histories: list[list[int]]) -> int:
    """Tokens a prefix tree of `histories` holds (shared prefixes counted once)."""
    hs = sorted(histories)
    total = len(hs[0]) if hs else 0
    for prev, cur in zip(hs, hs[1:]):
        total += len(cur) - common_prefix(prev, cur)
    return total


def kv_tokens(scripts: list[list[ModelCall]], fraction: float | None) -> int:
    """KV pool for a workload: room for every agent's final history (plus slack), or `fraction`
    of what the final histories hold with shared prefixes stored once -- never less than the
    longest single request needs with room under the engine's high-water mark (a request above
    it would wait forever)."""
    finals = [s[-1].prompt + s[-1].output for s in scripts]
    want = sum(map(len, finals)) * 1.25 + 4096 if fraction is None else unique_tokens(finals) * fraction
    want = max(want, max(map(len, finals)) / (0.9 * EngineConfig.high_water) + 4 * PAGE)
    return int(-(-want // PAGE) * PAGE)


class SystemFactory:
    """Builds each system for a case; peers are loaded once and reused (their caches are reset
    per run), agentrt gets a fresh engine per run. A peer that cannot load is a NotRun."""

    def __init__(self, lm, base: EngineConfig, threads: int = 2) -> None:
        self.lm, self.base, self.threads = lm, base, threads
        self._peers: dict[str, object] = {}
        self.warmed: set[str] = set()

    def get(self, name: str, kv_cache_tokens: int):
        if name in AGENTRT:
            cfg = self.base.replace(kv_cache_tokens=kv_cache_tokens)
            return getattr(AgentrtSystem, {"agentrt": "full", "agentrt_stateless": "stateless",
                                           "agentrt_prefix_lru": "prefix_lru",
                                           "agentrt_no_tier": "no_tier"}[name])(self.lm, cfg)
        if name not in self._peers:
            self._peers[name] = self._load_peer(name)
        return self._peers[name]

    def _load_peer(self, name: str):
        from bench.peers.llamacpp_peer import LlamaCppSystem

        path = str(self.lm.source)
        if name == "llamacpp_shared":
            return LlamaCppSystem.shared(path, self.threads)
        if name == "llamacpp_per_agent":
            return LlamaCppSystem.per_agent_system(path, self.threads)
        try:
            from bench.peers.hf_peer import TransformersSystem

            return TransformersSystem.load(path)
        except Exception as exc:  # not installed, or cannot read the GGUF
            return NotRun(name, f"transformers could not load the GGUF: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        for peer in self._peers.values():
            if hasattr(peer, "close"):
                peer.close()
