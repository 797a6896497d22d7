"""Simulated against measured, the comparisons bench_sim.py reports for every workload: the
ranking of the policies (or systems) and the sim / real ratios summed up over cases."""

from __future__ import annotations

import statistics

BAND = (0.85, 1.15)  # issue 28's goal for sim / real


def ranking(entries: dict, metric: str, tol: float = 0.05) -> dict:
    """`entries`: name -> {"real": {...}, "sim": {...}}, ranked by `metric` (lower is better).
    Only the pairs the real runs order beyond `tol` (their own noise) are judged: whether the
    simulation orders each the same way."""
    def value(name: str, side: str) -> float | None:
        return entries[name][side].get(metric)

    names = sorted(entries)
    resolved, agree = [], []
    for i, p in enumerate(names):
        for q in names[i + 1:]:
            rp, rq, sp, sq = value(p, "real"), value(q, "real"), value(p, "sim"), value(q, "sim")
            if None in (rp, rq, sp, sq) or abs(rp - rq) <= tol * min(rp, rq):
                continue
            resolved.append((p, q))
            agree.append((rp < rq) == (sp < sq))
    order = {side: sorted(names, key=lambda n: value(n, side) or float("inf")) for side in ("real", "sim")}
    return {"ranking_real": order["real"], "ranking_sim": order["sim"], "ranking_tolerance": tol,
            "ranking_pairs_resolved": resolved, "ranking_pairs_agree": agree, "ranking_agrees": all(agree)}


def summary(cases: dict, group: str, metrics: tuple[str, ...], prefix: str = "") -> dict:
    """Medians of sim / real per metric over every case's `group` entries, how many fall in the
    band, and each case's ranking verdict."""
    ratios = {m: [e["sim_over_real"][m] for c in cases.values() for e in c[group].values()
                  if e["sim_over_real"][m] is not None] for m in metrics}
    lo, hi = BAND
    return {f"{prefix}sim_over_real_{m}_median": statistics.median(v) if v else None for m, v in ratios.items()} | {
        f"{prefix}cases_within_{lo}_{hi}": {m: sum(lo <= x <= hi for x in v) for m, v in ratios.items()},
        f"{prefix}n_cases": len(ratios[metrics[0]]),
        f"{prefix}ranking_agrees": {n: c["ranking_agrees"] for n, c in cases.items()},
        f"{prefix}ranking_pairs_agreeing": {n: f"{sum(c['ranking_pairs_agree'])}/{len(c['ranking_pairs_resolved'])}"
                                            for n, c in cases.items()}}
