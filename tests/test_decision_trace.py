"""The per-decision trace (scheduling/trace.py, EngineConfig.decision_trace): off by default; on,
each scheduling decision records its candidates, the policy's order and score terms, the resident
prefixes, what was admitted and what was evicted, on the real engine (tiny model, a diamond
workflow on a tight pool, as tests/test_tight_pool.py)."""

from __future__ import annotations

import anyio
import pytest

from agentrt import Engine, EngineConfig
from agentrt.errors import ConfigError
from bench.workflow_trace import churn
from tests import test_tight_pool as tp
from tests.conftest import tiny_model


def test_the_trace_is_off_by_default():
    async def main():
        async with Engine(tiny_model(), EngineConfig()) as eng:
            assert eng.core.scheduler.trace is None
            with pytest.raises(ConfigError, match="decision_trace"):
                eng.decision_trace()

    anyio.run(main)


@pytest.mark.parametrize("policy", ["fcfs", "lpm", "topas"])
def test_each_decision_records_candidates_terms_admissions_and_evictions(policy):
    seen = {}

    async def run():
        finished, calls, st = await tp._run(policy, False, decision_trace=4096, on_close=seen.update)
        return calls

    calls = anyio.run(run)
    records = seen["trace"]
    assert records and [r["index"] for r in records] == list(range(len(records)))
    admitted = [k for r in records for k in r["admitted"]]
    assert len(admitted) == len(calls)  # every call admitted once (no preemption here), each in a record
    for r in records:
        keys = {c["key"] for c in r["ready"]}
        assert r["policy"] == policy and set(r["order"]) <= keys and set(r["admitted"]) <= set(r["order"])
        assert r["order"] == [k for k in r["order"] if k in keys]
        assert all(c["stage"] in "ABCD" and c["task"].startswith("t") for c in r["ready"])
    if policy == "topas":
        chosen = [t for r in records for t in r["terms"] if t["chosen"]]
        assert len(chosen) == len(records)
        assert all({"progress", "moves_s", "work_s", "evictions_s", "score"} <= set(t) for t in chosen)
    elif policy == "lpm":
        assert all(len(r["terms"]) == len(r["order"]) for r in records)
    assert sum(len(r["evicted"]) for r in records) > 0  # (a pool of 1.25 prefixes: prefixes leave)
    assert all(e["agent"] in "ABCD" and e["pages"] > 0 for r in records for e in r["evicted"])


def test_churn_counts_the_pages_inside_each_agents_prefix_only():
    """bench/workflow_trace.py's churn: a session's suffix leaf starts on the prefix's last,
    partial page (its start is inside the prefix): its pages are the session's, not the prefix's."""
    records = [
        {"prefix_len": {"A": 3005, "B": 0}, "evicted": [
            {"agent": "A", "start": 0, "tokens": 2992, "pages": 187},  # the prefix's whole pages
            {"agent": "A", "start": 2992, "tokens": 224, "pages": 14},  # a session's suffix
        ]},
        {"prefix_len": {"B": 2065, "A": 3300}, "evicted": [  # (A's learned length was long at first)
            {"agent": "B", "start": 1024, "tokens": 1040, "pages": 65},  # the prefix's tail
            {"agent": "A", "start": 2992, "tokens": 900, "pages": 57},  # a suffix: A's prefix is 3005
        ]},
    ]
    got = churn(records, 16)
    assert got == {"decisions": 2, "prefix_pages_evicted": 187 + 65, "per_agent": {"A": 187, "B": 65}}
