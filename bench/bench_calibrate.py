"""This machine's step cost model for the simulator (agentrt.sim): real engine steps on the
embedded model timed over decode (1-16 sequences, short and long contexts) and prefill shapes,
fitted by non-negative least squares (agentrt/sim/calibrate.py). Writes
bench/results/cost_cpu.json (the CPU recorded in it), which bench_sim.py --costs reads.

    agentrt bench calibrate [--quick]      (= python -m bench.bench_calibrate)
"""

from __future__ import annotations

import argparse

from agentrt import DEFAULT_MODEL, load_model  # noqa: E402
from agentrt.sim.calibrate import calibrate  # noqa: E402
from bench.common import RESULTS, machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer shapes (about a minute)")
    ap.add_argument("--out", default=str(RESULTS / "cost_cpu.json"))
    a = ap.parse_args()
    costs = calibrate(load_model(DEFAULT_MODEL), quick=a.quick)
    m = machine()
    costs.details.update(machine=m)
    print(f"{costs.name} on {m['cpu_model']} ({m['cpu_kind']}):")
    for k in ("base_s", "per_seq_s", "per_token_s", "per_pair_s", "per_key_s", "tier_copy_s_per_page"):
        print(f"  {k:22s} {getattr(costs, k):.3e}")
    print(f"  fit: mean relative error {costs.details['fit_rel_err_mean']:.1%}, max {costs.details['fit_rel_err_max']:.1%}")
    print("wrote", costs.save(a.out))


if __name__ == "__main__":
    main()
