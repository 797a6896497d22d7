"""Crash safety of the durable state (issue 59): SIGKILL at random moments of a soak of agent
turns with tool calls and stored responses, then reopen and verify. Used by bench_restart.py
(`crash_kills`, `corrupt_records_used`, `acknowledged_responses_lost`) and, briefly, by
tests/test_durable_crash.py.

Each run forks a child from this process (the model is built once, before any fork; torch runs
one thread here, so no OpenMP pool is inherited half-alive). The child:
  1. verifies what the last killed child left: up to two chains of KV records, walked from a
     root; their tokens plus one are completed on an engine over the state dir (restoring the
     records) and on one without (computing them): any difference is a corrupt record used;
  2. runs three agents (a tool each, tool_choice required) turn after turn; after each turn it
     stores a response in the state store and only then prints `ACK <id> <digest>` -- what a
     client would have received.
The parent kills it after a random delay (from fork: startup, verification and soak all get
hit), then checks that every acknowledged response is stored with its body, that SQLite's
integrity check passes, and that every indexed KV record's file passes its checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import select
import signal
import sqlite3
import time
from pathlib import Path

import anyio
import torch

AGENTS = 3


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def tiny_model():
    from tests.conftest import tiny_native_with_tokenizer

    return tiny_native_with_tokenizer()


def _cfg(state_dir: str | None):
    from agentrt import EngineConfig

    return EngineConfig(kv_cache_tokens=8192, response_cache_size=0, state_dir=state_dir,
                        max_session_seqs=8, max_transient_seqs=4)


async def _verify(model, state_dir: str, rng: random.Random) -> list[str]:
    """Complete two record chains' tokens with and without the state dir: 'ok' or 'bad' each."""
    from agentrt import Engine, SamplingParams
    from agentrt.state import open_store

    store = open_store(state_dir)
    chains = []
    async with Engine(model, _cfg(state_dir)) as eng:
        disk = eng.core.disk
        for _ in range(2):
            h, tokens = disk.hasher(disk.space_key(None, _base())), []
            while True:
                kids = store.kv_children(h.hexdigest())
                if not kids:
                    break
                row = rng.choice(kids)
                run = list(memoryview(row.tokens).cast("i"))
                tokens += run
                h.update(row.tokens)
            if tokens:
                chains.append(tokens + [5])
        p = SamplingParams(max_tokens=4, temperature=0.0)
        got = [(await eng.complete(t, p)).token_ids for t in chains]
    async with Engine(model, _cfg(None)) as ref:
        want = [(await ref.complete(t, p)).token_ids for t in chains]
    store.close()
    return ["ok" if g == w else "bad" for g, w in zip(got, want)]


def _base():
    from agentrt.kv.identity import BASE

    return BASE


async def _soak(model, state_dir: str, seed: int) -> None:
    from agentrt import Agent, Engine, Runtime, SamplingParams
    from agentrt.state import StoredResponse, open_store

    rng = random.Random(seed)
    for verdict in await _verify(model, state_dir, rng):
        print(f"VERIFY {verdict}", flush=True)
    store = open_store(state_dir)
    async with Engine(model, _cfg(state_dir)) as eng, Runtime(eng) as rt:
        refs = [await rt.spawn(Agent(f"a{i}", f"Agent {i} adds numbers with the add tool. " * 8, [add],
                                     tool_choice="required", max_tool_rounds=1,
                                     settings=SamplingParams(max_tokens=40, temperature=0.0)))
                for i in range(AGENTS)]
        print("READY", flush=True)
        n = 0
        while True:
            i, n = rng.randrange(AGENTS), n + 1
            result = await refs[i].ask(f"What is {rng.randrange(100)} plus {rng.randrange(100)}?")
            body = {"id": f"resp_{seed}_{n}", "messages": result.messages}
            digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
            store.put_response(StoredResponse(body["id"], "soak", body, [], f"agent/a{i}", time.time() + 86400),
                               100_000)
            print(f"ACK {body['id']} {digest}", flush=True)


def _child(model, state_dir: str, seed: int, out_fd: int) -> None:
    os.dup2(out_fd, 1)
    code = 0
    try:
        anyio.run(_soak, model, state_dir, seed)
    except BaseException as e:  # (a crash of the soak itself is reported, then the parent counts it)
        while isinstance(e, BaseExceptionGroup) and e.exceptions:
            e = e.exceptions[0]
        print(f"ERROR {type(e).__name__}: {e}", flush=True)
        code = 1
    os._exit(code)


def _run_once(model, state_dir: str, seed: int, kill_after: float) -> list[str]:
    """Fork a child, kill it after `kill_after` seconds (or when it exits), return its lines."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(model, state_dir, seed, w)
    os.close(w)
    buf, deadline = b"", time.monotonic() + kill_after
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            buf += chunk
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    while chunk := os.read(r, 65536):
        buf += chunk
    os.close(r)
    return buf.decode(errors="replace").splitlines()


def _check(state_dir: str, acked: dict[str, str], model) -> tuple[int, int, bool]:
    """(acknowledged responses missing or changed, indexed records failing their check, integrity ok)."""
    from agentrt.state import open_store
    from agentrt.state.records import CorruptRecord, read_record, record_path

    con = sqlite3.connect(Path(state_dir) / "state.db")
    ok = con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    store = open_store(state_dir)
    lost = 0
    for rid, digest in acked.items():
        got = store.get_response("soak", rid)
        if got is None or hashlib.sha256(json.dumps(got.body, sort_keys=True).encode()).hexdigest()[:16] != digest:
            lost += 1
    bad = 0
    cfg = model.model.cfg
    for row in store.kv_all():
        shape = (cfg.num_layers, row.n, cfg.num_kv_heads, cfg.head_dim)
        try:
            read_record(record_path(state_dir, row.id), row.id, shape, model.model.kv_dtype)
        except CorruptRecord:
            bad += 1
    store.close()
    return lost, bad, ok


def soak(state_dir: str, kills: int, seed: int = 0, max_delay: float = 3.0, progress=None) -> dict:
    """`kills` SIGKILLs of soak children over one state dir; the verified counts."""
    torch.set_num_threads(1)
    model = tiny_model()
    rng = random.Random(seed)
    acked: dict[str, str] = {}
    out = {"crash_kills": 0, "acknowledged_responses": 0, "acknowledged_responses_lost": 0,
           "indexed_records_failing_check": 0, "integrity_failures": 0, "verified_chains": 0,
           "corrupt_records_used": 0, "child_errors": 0, "turns_acknowledged_per_run": []}
    for k in range(kills):
        lines = _run_once(model, state_dir, seed * 100_000 + k, rng.uniform(0.05, max_delay))
        out["crash_kills"] += 1
        run_acks = 0
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "ACK":
                rid, digest = rest.split()
                acked[rid] = digest
                run_acks += 1
            elif kind == "VERIFY":
                out["verified_chains"] += 1
                out["corrupt_records_used"] += rest == "bad"
            elif kind == "ERROR":
                out["child_errors"] += 1
                out.setdefault("child_error_kinds", {}).setdefault(rest.split(":")[0], 0)
                out["child_error_kinds"][rest.split(":")[0]] += 1
                out["child_error_last"] = rest[:300]
        out["turns_acknowledged_per_run"].append(run_acks)
        lost, bad, ok = _check(state_dir, acked, model)
        out["acknowledged_responses_lost"] = max(out["acknowledged_responses_lost"], lost)
        out["indexed_records_failing_check"] += bad
        out["integrity_failures"] += not ok
        if progress is not None:
            progress(k + 1, out)
    out["acknowledged_responses"] = len(acked)
    return out
