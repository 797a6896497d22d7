"""The headline keys of bench/results/agents.json and `--merge` (bench/bench_agents.py).

Why a merge: the full memory cases take over an hour on 2 cores, the rest of the full run
hours more; each can be run on its own (`--cases ... --merge`) into the same JSON, and the
headline keys are recomputed from whichever cases the merged file then holds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# key: (cases, in order of preference: the first present is used; peer; ratio)
REQUIRED = {
    "per_turn_speedup_6turn_vs_stateless": (("turns6",), "agentrt_stateless", "per_turn_speedup"),
    "median_turn_speedup_35turn_vs_stateless": (("turns35",), "agentrt_stateless", "median_turn_speedup"),
    "e2e_speedup_8agents_vs_llamacpp_per_agent": (("agents8",), "llamacpp_per_agent", "e2e_speedup"),
    "e2e_speedup_8agents_vs_llamacpp_shared": (("agents8",), "llamacpp_shared", "e2e_speedup"),
    "e2e_speedup_8agents_vs_transformers": (("agents8",), "transformers", "e2e_speedup"),
    # mem8_p60 since the KV memory hierarchy; agents8_small_pool (interleaved, no tool waits)
    # only where mem8_p60 was not run (headline_sources says which)
    "per_turn_speedup_8agents_vs_prefix_lru": (("mem8_p60", "agents8_small_pool"), "agentrt_prefix_lru",
                                               "per_turn_speedup"),
    "hit_rate_gain_pp_vs_lru": (("mem8_p60",), "agentrt_prefix_lru", "hit_rate_gain_pp"),
    "ttft_reduction_vs_lru": (("mem8_p60",), "agentrt_prefix_lru", "ttft_reduction"),
    "e2e_speedup_bfcl_vs_llamacpp_per_agent": (("bfcl",), "llamacpp_per_agent", "e2e_speedup"),
    # issue 29: the long-context agents (bench/cases/memory_cases.py: long8_p60)
    "long_hit_rate_gain_pp_vs_lru": (("long8_p60",), "agentrt_prefix_lru", "hit_rate_gain_pp"),
    "long_ttft_reduction_vs_lru": (("long8_p60",), "agentrt_prefix_lru", "ttft_reduction"),
    "long_per_turn_speedup_vs_prefix_lru": (("long8_p60",), "agentrt_prefix_lru", "per_turn_speedup"),
}
PREFETCH_CASE = "long8_p60"  # prefetch_used_fraction: the hierarchy's prefetches there that were used
SNAPSHOT_KEY = "snapshot_restore_speedup_vs_prefill"


def headline(cases: dict, snapshot: dict | None = None) -> tuple[dict, dict]:
    """The required keys (median over repetitions) and, for each null, the reason."""
    keys, reasons = {}, {}
    for key, (names, peer, ratio) in REQUIRED.items():
        case = next((n for n in names if n in cases), names[0])
        c = cases.get(case)
        value = c["ratios"].get(peer, {}).get(ratio, {}).get("median") if c else None
        keys[key] = value
        if value is None:
            reasons[key] = _why_missing(c, case, peer)
    keys["prefetch_used_fraction"] = prefetch_used(cases.get(PREFETCH_CASE))
    if keys["prefetch_used_fraction"] is None:
        reasons["prefetch_used_fraction"] = f"{PREFETCH_CASE}: not run, or agentrt prefetched nothing"
    keys[SNAPSHOT_KEY] = (snapshot or {}).get("speedup")
    if keys[SNAPSHOT_KEY] is None:
        reasons[SNAPSHOT_KEY] = (snapshot or {}).get("reason", "snapshot measurement not run (--cases)")
    return keys, reasons


def prefetch_used(case: dict | None) -> float | None:
    """Prefetched pages used before they left the pool / prefetched, agentrt over every
    repetition of `case` (None: not run, or nothing prefetched)."""
    reps = [r["counters"] for r in ((case or {}).get("systems", {}).get("agentrt", {}).get("per_rep") or [])]
    done = sum(r.get("prefetched_pages", 0) for r in reps)
    return sum(r.get("prefetch_used_pages", 0) for r in reps) / done if done else None


def headline_sources(cases: dict) -> dict:
    """Which case each ratio key was taken from (the first of its candidates present)."""
    return {key: next((n for n in names if n in cases), None) for key, (names, _, _) in REQUIRED.items()}


def _why_missing(c: dict | None, case: str, peer: str) -> str:
    """Why a required ratio is null."""
    if c is None:
        return f"case {case} not run (--cases)"
    if peer not in c["systems"]:
        return f"{peer} not selected (--systems)"
    if c["systems"][peer].get("status") != "ok":
        return c["systems"][peer]["reason"]
    a = c["systems"].get("agentrt", {})
    if a.get("status") == "ok":
        return "ratio not computed for this case (written by an older bench_agents.py)"
    return "agentrt " + a.get("reason", "did not run")


def load_previous(path: Path, quick: bool) -> dict:
    """The JSON already at `path` (empty if none or unreadable); warns when it was written in
    the other mode (--quick vs full), since merged cases would then mix sizes."""
    if not path.exists():
        return {}
    try:
        prev = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"warning: --merge: cannot read {path} ({exc}); writing this run's cases only", file=sys.stderr)
        return {}
    if prev.get("quick") != quick:
        print(f"warning: --merge: {path} holds {'quick' if prev.get('quick') else 'full'} cases, this run is "
              f"{'quick' if quick else 'full'}; each case records its own `quick`", file=sys.stderr)
    return prev


def merge(prev: dict, cases: dict, snapshot: dict | None,
          pipelined: dict | None) -> tuple[dict, dict | None, dict | None]:
    """(cases, snapshot, pipelined tools): this run's where it ran them, else the previous file's."""
    merged = {k: v for k, v in prev.get("cases", {}).items() if k not in cases}
    merged.update(cases)
    return merged, snapshot or prev.get("snapshot"), pipelined or prev.get("pipelined_tools")
