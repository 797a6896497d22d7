"""Memory cases of bench/bench_agents.py: many agents over a KV pool too small for their
histories, tools taking random time. What the KV memory hierarchy (second tier, prefetch, TTL
pins) is for: while an agent waits on a tool its KV must go somewhere cheaper than recompute.

Keys `mem<A>_p<F>`: A agents (8, 16) x 6 turns at the issue's sizes (1000-token shared anchor,
150-token user message, 150-300-token tool results), KV pool = F% of their final histories
(shared prefixes counted once), arrival concurrent, tool latencies drawn per tool
(bench/workloads/latency.py, seeded per repetition). Systems: agentrt (full hierarchy),
agentrt_no_tier, agentrt_prefix_lru (radix + LRU: the vLLM/SGLang-like baseline). The 8-agent
cases at 80% and 100% are the plot's extra points (agents_memory.png).

Long-context cases `long<A>_p<F>` (issue 29): each agent its own long anchor (instructions and
tool schemas; --quick 1,500 tokens, full 2,500), tool results of 300-700 (full 450-700) tokens,
histories growing toward the model's 8k context over 8 turns, heavy-tailed tool latencies. Where losing KV costs most: recomputing a 6k history takes seconds on 2 cores.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from bench.cases.agents_cases import Case
from bench.common import print_table
from bench.workloads.latency import LatencyDist, with_tool_latency
from bench.workloads.synthetic_agents import SyntheticSpec, synthetic_scripts

MEM_SYSTEMS = ("agentrt", "agentrt_no_tier", "agentrt_prefix_lru")
DEFAULT_DIST = "lognormal:0.2:0.8"  # median 0.2 s; p90 ~0.56 s, p99 ~1.3 s before the tool's scale
FULL = SyntheticSpec(agents=8, turns=6)  # the sizes (SyntheticSpec defaults)
# --quick: ~450-token anchor (2 tool schemas), 3 turns, short calls: seconds per run on 2 cores
QUICK = SyntheticSpec(agents=8, turns=3, anchor_tokens=200, user_tokens=30, result_tokens=(40, 80),
                      n_tools=2, max_args=0)
# (agents, pool fraction): the headline pairs, then the plot's extra points (8 agents)
POINTS = ((8, 0.6), (8, 0.4), (16, 0.6), (16, 0.4), (8, 0.8), (8, 1.0))
# (the embedded model's context is 8k: a 2.5k anchor and 7 results of up to 700 tokens fill it)
LONG_FULL = SyntheticSpec(agents=8, turns=8, anchor_tokens=2500, user_tokens=150, result_tokens=(450, 700),
                          n_tools=12, shared_system=False)
LONG_QUICK = SyntheticSpec(agents=8, turns=8, anchor_tokens=1500, user_tokens=150, result_tokens=(300, 700),
                           n_tools=8, shared_system=False)
LONG_POINTS_QUICK = ((8, 0.6),)
LONG_POINTS = ((8, 0.6), (8, 0.4), (8, 0.8), (16, 0.6))
ALIAS = "mem"  # --cases mem: every memory case + the snapshot measurement
LONG_ALIAS = "long"  # --cases long: the long-context memory cases
SNAPSHOT = "snapshot"  # --cases snapshot: the snapshot/restore measurement alone
LATENCY_SEED = 1_000  # repetition r draws its tool latencies with seed LATENCY_SEED + r
_KEY = re.compile(r"^mem(\d+)_p(\d+)$")  # (the plot: short cases only)


def memory_key(agents: int, fraction: float, prefix: str = "mem") -> str:
    return f"{prefix}{agents}_p{round(fraction * 100)}"


MEMORY_KEYS = tuple(memory_key(a, f) for a, f in POINTS)
LONG_KEYS = tuple(memory_key(a, f, "long") for a, f in LONG_POINTS)
PLOT_ONLY_KEYS = MEMORY_KEYS[4:]  # left out of a plain --quick run (minutes); --quick --memory runs them


def memory_cases(fmt, tok, *, quick: bool, dist: str = DEFAULT_DIST, distinct: bool = False,
                 arrival: str | None = None) -> list[Case]:
    """The memory cases, headline pairs first. The same repetition gets the same scripts and
    tool latencies in every case, so pool fractions compare like with like."""
    base = dataclasses.replace(QUICK if quick else FULL, shared_system=not distinct)
    latency = LatencyDist.parse(dist)
    cases = []
    for agents, fraction in POINTS:
        spec = dataclasses.replace(base, agents=agents)
        title = (f"{agents} agents x {spec.turns} turns, KV pool {fraction:.0%} of their histories, "
                 f"tool latency {latency}")
        cases.append(Case(memory_key(agents, fraction), title, MEM_SYSTEMS, arrival or "concurrent",
                          _make(fmt, tok, spec, latency), fraction))
    long = LONG_QUICK if quick else LONG_FULL
    for agents, fraction in LONG_POINTS_QUICK if quick else LONG_POINTS:
        spec = dataclasses.replace(long, agents=agents)
        title = (f"{agents} agents x {spec.turns} turns, long contexts ({spec.anchor_tokens}-token anchors, results "
                 f"{spec.result_tokens[0]}-{spec.result_tokens[1]}), KV pool {fraction:.0%}, tool latency {latency}")
        cases.append(Case(memory_key(agents, fraction, "long"), title, MEM_SYSTEMS, arrival or "concurrent",
                          _make(fmt, tok, spec, latency), fraction))
    return cases


def _make(fmt, tok, spec: SyntheticSpec, latency: LatencyDist):
    """Scripts of repetition rep: the synthetic agents (seed + rep), latencies drawn (seeded)."""
    def make(rep: int):
        scripts = synthetic_scripts(fmt, tok, dataclasses.replace(spec, seed=spec.seed + rep))
        return with_tool_latency(scripts, latency, LATENCY_SEED + rep)
    return make


def expand(wanted: list[str]) -> tuple[set[str], bool]:
    """--cases names -> (case keys, whether the snapshot measurement runs); "mem" means every
    memory case and the snapshot measurement."""
    keys = set(wanted) - {ALIAS, SNAPSHOT, LONG_ALIAS}
    if ALIAS in wanted:
        keys |= set(MEMORY_KEYS) | set(LONG_KEYS)
    if LONG_ALIAS in wanted:
        keys |= set(LONG_KEYS)
    return keys, ALIAS in wanted or SNAPSHOT in wanted


def case_extras(case: dict) -> dict:
    """Per system: the tool TTLs the engine chose and the hierarchy's counters, per repetition
    (from the engine's stats; empty on an engine without the hierarchy)."""
    out = {}
    for name, s in case["systems"].items():
        reps = [r["counters"] for r in s.get("per_rep", [])]
        ttls = [r["tool_ttls"] for r in reps if "tool_ttls" in r]
        if ttls:
            out.setdefault("tool_ttls", {})[name] = ttls
        knobs = [r["tier_knobs"] for r in reps if "tier_knobs" in r]
        if knobs:
            out.setdefault("tier_knobs", {})[name] = knobs[0]
    return out


def print_memory(key: str, case: dict) -> None:
    """The hierarchy's counters, one row per counter, one column per system (median over
    repetitions; "-": this engine has no such counter)."""
    from bench.peers.agentrt_peer import TIER_COUNTERS

    names = [n for n, s in case["systems"].items() if s.get("per_rep")]
    if not names:
        return
    reps = {n: [r["counters"] for r in case["systems"][n]["per_rep"]] for n in names}
    rows = [[c, *(_median([r[c] for r in reps[n] if c in r]) for n in names)]
            for c in ("hit_rate", "preemptions", "detached_sessions", "tool_hints", *TIER_COUNTERS)
            if c != "tool_ttls"]
    print_table(f"{key}: KV memory counters (median over reps)", ["counter", *names], rows)
    for name, ttls in case.get("tool_ttls", {}).items():
        if ttls[-1]:
            chosen = ", ".join(f"{t} {v:.2f}" for t, v in ttls[-1].items())
            print(f"{key}: {name} chose tool TTLs (s, last rep): {chosen}")


def _median(xs: list) -> str | float:
    if not xs:
        return "-"
    xs = sorted(xs)
    return float(xs[len(xs) // 2])


def plot_memory(cases: dict, out_dir: Path) -> list[Path]:
    """agents_memory.png: KV hit rate and mean TTFT against pool fraction, one line per system
    (8 agents solid, 16 agents dashed where run)."""
    series = _series(cases)
    if not series:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.agents_report import _color

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (agents, name), pts in sorted(series.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        style = dict(marker="o", color=_color(name), linestyle="-" if agents == 8 else "--",
                     label=f"{name} ({agents} agents)")
        axes[0].plot(xs, [100 * p[1] for p in pts], **style)
        axes[1].plot(xs, [p[2] for p in pts], **style)
    axes[0].set(xlabel="KV pool / agents' histories", ylabel="KV hit rate (%)", title="prompt tokens served from KV")
    axes[1].set(xlabel="KV pool / agents' histories", ylabel="mean TTFT (ms)", title="time to first token")
    for ax in axes:
        ax.set_xlim(0.3, 1.1)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "agents_memory.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def _series(cases: dict) -> dict[tuple[int, str], list[tuple[float, float, float]]]:
    """{(agents, system): [(fraction, hit rate, mean TTFT ms)]} of the memory cases run."""
    out: dict = {}
    for key, case in cases.items():
        m = _KEY.match(key)
        if not m:
            continue
        for name, s in case["systems"].items():
            if s.get("status") == "ok":
                point = (int(m[2]) / 100, s["hit_rate"], s["mean_ttft_ms"]["median"])
                out.setdefault((int(m[1]), name), []).append(point)
    return out
