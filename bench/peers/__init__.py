"""Systems under test in bench/bench_agents.py, behind one interface: `name`, `async
warmup()`, `async run(scripts, arrival) -> RunResult` (see base.py). A peer that cannot run is
a `NotRun` with its reason."""

from bench.peers.base import ARRIVALS, CallRecord, NotRun, RunResult, drive

__all__ = ["ARRIVALS", "CallRecord", "NotRun", "RunResult", "drive"]
