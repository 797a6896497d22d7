"""Metrics, ratios, tables and plots of bench/bench_agents.py.

Per run (one system, one repetition): per-turn latency (mean over agents of time to first token
and of total call time, by turn index), wall time, prompt tokens computed / submitted, KV hit
rate, tokens/s. Ratios peer / agentrt (> 1: agentrt faster) are computed per repetition, then
summarised as median and p90 over repetitions.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from bench.cases.agents_cases import SYSTEMS
from bench.common import print_table
from bench.peers.base import RunResult

RATIOS = ("e2e_speedup", "per_turn_speedup", "median_turn_speedup", "ttft_speedup")
# differences, not speedups (not in the table's columns): agentrt's KV hit rate minus the
# peer's in percentage points, and the fraction of the peer's mean TTFT agentrt saves
GAINS = ("hit_rate_gain_pp", "ttft_reduction")


def _by_turn(records, attr: str) -> list[float]:
    """Mean over agents of `attr` (seconds) per turn index, in ms."""
    turns: dict[int, list[float]] = {}
    for r in records:
        turns.setdefault(r.turn, []).append(getattr(r, attr))
    return [statistics.mean(turns[t]) * 1e3 for t in sorted(turns)]


def summarize(res: RunResult) -> dict:
    """One run's metrics."""
    recs = res.records
    sub = sum(r.prompt_tokens for r in recs)
    comp = sum(r.computed_prompt_tokens for r in recs)
    out = sum(r.output_tokens for r in recs)
    total, ttft = _by_turn(recs, "total_s"), _by_turn(recs, "ttft_s")
    return {
        "wall_s": res.wall_s, "turn_total_ms": total, "turn_ttft_ms": ttft,
        "mean_turn_ms": statistics.mean(total), "mean_ttft_ms": statistics.mean(ttft),
        "prompt_submitted": sub, "prompt_computed": comp,
        "computed_over_submitted": comp / sub if sub else 0.0,
        "hit_rate": res.extra.get("hit_rate", 1 - comp / sub if sub else 0.0),
        "output_tokens": out, "output_tok_s": out / res.wall_s,
        "processed_tok_s": (sub + out) / res.wall_s,
        "calls": len(recs), "exact": all(r.exact for r in recs), "counters": res.extra,
    }


def ratios(ref: dict, peer: dict) -> dict:
    """peer / agentrt ratios of one repetition (> 1: agentrt is faster)."""
    a, b = ref["turn_total_ms"], peer["turn_total_ms"]
    return {"e2e_speedup": peer["wall_s"] / ref["wall_s"],
            "per_turn_speedup": statistics.mean(b) / statistics.mean(a),
            "median_turn_speedup": statistics.median(y / x for x, y in zip(a, b)),
            "ttft_speedup": peer["mean_ttft_ms"] / ref["mean_ttft_ms"],
            "hit_rate_gain_pp": 100.0 * (ref["hit_rate"] - peer["hit_rate"]),
            "ttft_reduction": 1.0 - ref["mean_ttft_ms"] / peer["mean_ttft_ms"]}


def stat(values: list[float]) -> dict:
    """Median and p90 over repetitions, with the values themselves."""
    return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)),
            "per_rep": [float(v) for v in values]}


def aggregate_system(reps: list[dict]) -> dict:
    """A system's runs over repetitions: medians (and p90 of wall time and mean turn)."""
    med = lambda key: float(np.median([r[key] for r in reps]))  # noqa: E731
    return {
        "status": "ok", "wall_s": stat([r["wall_s"] for r in reps]),
        "mean_turn_ms": stat([r["mean_turn_ms"] for r in reps]),
        "mean_ttft_ms": stat([r["mean_ttft_ms"] for r in reps]),
        "turn_total_ms": [float(np.median(col)) for col in zip(*(r["turn_total_ms"] for r in reps))],
        "turn_ttft_ms": [float(np.median(col)) for col in zip(*(r["turn_ttft_ms"] for r in reps))],
        **{k: med(k) for k in ("prompt_submitted", "prompt_computed", "computed_over_submitted", "hit_rate",
                               "output_tok_s", "processed_tok_s")},
        "exact": all(r["exact"] for r in reps), "per_rep": reps,
    }


def aggregate_ratios(per_rep: list[dict[str, dict]]) -> dict:
    """{peer: {ratio: stat}} from per-repetition {peer: ratios}."""
    peers = sorted({p for rep in per_rep for p in rep})
    return {p: {k: stat([rep[p][k] for rep in per_rep if p in rep]) for k in RATIOS + GAINS} for p in peers}


def _fmt(x, digits: int = 3) -> str:
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _wide_table(title: str, columns: list[str], rows: list[list]) -> None:
    """A rich table wide enough for system names even when stdout is not a terminal."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console(width=160).print(t)


def print_case(key: str, case: dict) -> None:
    """Summary table and per-turn table of one case."""
    systems = {n: s for n, s in case["systems"].items() if s.get("status") == "ok"}
    rows = []
    for name, s in systems.items():
        r = case["ratios"].get(name, {})
        rows.append([name, f"{s['wall_s']['median']:.1f}", f"{s['mean_turn_ms']['median']:.0f}",
                     f"{s['mean_ttft_ms']['median']:.0f}", f"{s['prompt_computed']:.0f}/{s['prompt_submitted']:.0f}",
                     f"{s['hit_rate']:.2f}", f"{s['output_tok_s']:.1f}",
                     *(_fmt(r.get(k, {}).get("median", "-")) for k in RATIOS), "yes" if s["exact"] else "NO"])
    for name, s in case["systems"].items():
        if s.get("status") != "ok":
            rows.append([name, "not run: " + s["reason"]] + [""] * 10)
    _wide_table(f"{key}: {case['title']} ({case['arrival']}, median of {case['reps']} rep(s))",
                ["system", "wall s", "turn ms", "ttft ms", "prefill computed/submitted", "KV hit", "out tok/s",
                 "x e2e", "x turn", "x median turn", "x ttft", "exact"], rows)
    if len(systems) > 1:
        names = list(systems)
        turns = zip(*(systems[n]["turn_total_ms"] for n in names))
        print_table(f"{key}: per-turn latency (ms, mean over agents, median over reps)",
                    ["turn"] + names, [[t + 1, *(f"{x:.0f}" for x in row)] for t, row in enumerate(turns)])


def plot(cases: dict, out_dir: Path) -> list[Path]:
    """agents_turns.png (per-turn latency vs turn index per system, one panel per case) and
    agents_e2e.png (wall time per system, one panel per case)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, c in cases.items() if any(s.get("status") == "ok" for s in c["systems"].values())]
    if not keys:
        return []
    paths = [out_dir / "agents_turns.png", out_dir / "agents_e2e.png"]
    cols = min(3, len(keys))
    rows = -(-len(keys) // cols)
    for path, draw in zip(paths, (_turn_panel, _e2e_panel)):
        fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 4 * rows), squeeze=False)
        for ax, key in zip(axes.flat, keys):
            draw(ax, key, cases[key])
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def _color(name: str) -> str:
    """The same colour for a system in every panel."""
    return f"C{SYSTEMS.index(name) % 10}" if name in SYSTEMS else "C9"


def _turn_panel(ax, key: str, case: dict) -> None:
    from matplotlib.ticker import MaxNLocator

    for name, s in case["systems"].items():
        if s.get("status") == "ok":
            ys = s["turn_total_ms"]
            ax.plot(range(1, len(ys) + 1), ys, marker="o", markersize=3, label=name, color=_color(name))
    ax.set(title=key, xlabel="turn", ylabel="latency per call (ms)", yscale="log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=7)


def _e2e_panel(ax, key: str, case: dict) -> None:
    ok = [(n, s["wall_s"]["median"]) for n, s in case["systems"].items() if s.get("status") == "ok"]
    ax.bar(range(len(ok)), [w for _, w in ok], color=[_color(n) for n, _ in ok])
    ax.set_xticks(range(len(ok)), [n for n, _ in ok], rotation=30, ha="right", fontsize=7)
    ax.set(title=key, ylabel="end-to-end wall time (s)")
