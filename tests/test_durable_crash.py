"""Crash safety of the durable state (issue 59), briefly: SIGKILL at random moments of a soak of
agent turns with tool calls and stored responses (bench/restart_soak.py; bench_restart.py runs
200), then every acknowledged response is stored with its body, SQLite's integrity check
passes, every indexed KV record passes its checksum, and restored chains complete as computed
ones do. In a fresh interpreter: the soak forks, which a test process's threads must not see."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT_DIR = Path(__file__).resolve().parents[1]


def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path):
    code = (f"import json; from bench.restart_soak import soak; "
            f"print(json.dumps(soak({str(tmp_path)!r}, kills=5, seed=3, max_delay=2.5)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT_DIR, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["crash_kills"] == 5 and r["acknowledged_responses"] > 0
    assert r["acknowledged_responses_lost"] == 0
    assert r["indexed_records_failing_check"] == 0 and r["integrity_failures"] == 0
    assert r["corrupt_records_used"] == 0 and r["child_errors"] == 0
