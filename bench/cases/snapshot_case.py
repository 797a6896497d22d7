"""Session snapshot/restore vs prefill from scratch (bench/bench_agents.py, key
`snapshot_restore_speedup_vs_prefill`).

Why: an agent parked for minutes (a human in the loop, a long job) or moved to another process
should come back without recomputing its history. Measured in one run, per repetition, each on
a fresh engine over the same weights (engine start off the clock): (a) prefill of a ~4k-token
session prompt from scratch, a 1-token generate; (b) `Engine.restore(path)` of that session's
snapshot on a new engine + a 1-token generate with the same prompt (it prefills only what the
snapshot lacks; each snapshot restored 3 times, the median taken). Speedup = (a) / (b) per
repetition, median over repetitions. No tier, prefetch or TTL: the session alone. Skipped, with the reason, while
the engine has no `Session.snapshot` / `Engine.restore`.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import aclosing
from pathlib import Path

import anyio

from agentrt import Engine, EngineConfig, SamplingParams
from bench.peers.agentrt_peer import with_known
from bench.workloads.agentic import text_of_tokens

PROMPT_TOKENS = 4096
ONE = SamplingParams(max_tokens=1, ignore_eos=True)


def session_prompt(fmt, tok, n_tokens: int = PROMPT_TOKENS) -> list[int]:
    """A chat prompt of about n_tokens: a system message and one long user message."""
    import random

    rng = random.Random(7)
    head = fmt.encode([{"role": "system", "content": "You are an agent."}], add_generation_prompt=False)
    body = text_of_tokens(tok, n_tokens - len(head) - 16, rng)
    return fmt.encode([{"role": "system", "content": "You are an agent."}, {"role": "user", "content": body}])


async def _timed_generate(eng: Engine, prompt: list[int], session) -> tuple[float, int]:
    """(seconds, prompt tokens computed) of a 1-token generate."""
    t0, usage = time.perf_counter(), None
    async with aclosing(eng.generate(prompt, ONE, session=session)) as events:
        async for ev in events:
            usage = ev.usage or usage
    return time.perf_counter() - t0, usage.computed_prompt_tokens if usage else len(prompt)


async def _one_rep(lm, cfg: EngineConfig, prompt: list[int], folder: Path, restores: int) -> dict:
    """Prefill from scratch and snapshot, then `restores` times: restore on a new engine +
    generate; the timings (restore: the median of those)."""
    async with Engine(lm, cfg) as eng:
        sess = await eng.open_session(tag="snap")
        prefill_s, computed = await _timed_generate(eng, prompt, sess)
        t0 = time.perf_counter()
        path = Path(await sess.snapshot(folder / "session.snap"))
        snapshot_s = time.perf_counter() - t0
        await sess.close()
    size = sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    runs = [await _restore(lm, cfg, prompt, path) for _ in range(restores)]
    restore_s = statistics.median(r["restore_s"] for r in runs)
    return {"prefill_s": prefill_s, "prefill_computed": computed, "snapshot_s": snapshot_s,
            "snapshot_bytes": size, "restores": runs, "restore_s": restore_s, "speedup": prefill_s / restore_s}


async def _restore(lm, cfg: EngineConfig, prompt: list[int], path: Path) -> dict:
    """Engine.restore(path) on a fresh engine (its start off the clock), then a 1-token generate."""
    async with Engine(lm, cfg) as eng:
        t0 = time.perf_counter()
        restored = await eng.restore(path)
        load_s = time.perf_counter() - t0
        gen_s, recomputed = await _timed_generate(eng, prompt, restored)
        await restored.close()
    return {"load_s": load_s, "generate_s": gen_s, "restore_s": load_s + gen_s, "computed": recomputed}


async def _measure(lm, cfg: EngineConfig, prompt: list[int], reps: int, restores: int) -> list[dict]:
    async with Engine(lm, cfg.replace(kv_cache_tokens=4096)) as eng:  # first-call allocations off the clock
        await eng.complete(list(range(100, 356)), ONE)
    out = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="agentrt_snap_") as d:
            out.append(await _one_rep(lm, cfg, prompt, Path(d), restores))
    return out


def missing_api() -> str | None:
    """Why the measurement cannot run on this engine, or None."""
    from agentrt.engine.session import Session

    lacks = [n for n, has in (("Session.snapshot", hasattr(Session, "snapshot")),
                              ("Engine.restore", hasattr(Engine, "restore"))) if not has]
    return f"not run: this engine has no {' / '.join(lacks)}" if lacks else None


def run_snapshot(lm, fmt, base: EngineConfig, reps: int, restores: int = 3) -> dict:
    """The measurement's JSON: per-repetition timings and the median speedup, or a reason.
    Restores are cheap and noisier (file cache, allocation), so each snapshot is restored
    `restores` times; prefills are the expensive part, `reps` of them."""
    reason = missing_api()
    if reason:
        return {"status": "not run", "reason": reason}
    prompt = session_prompt(fmt, lm.tokenizer)
    cfg = with_known(base.replace(kv_cache_tokens=max(base.kv_cache_tokens, 2 * len(prompt) + 1024)),
                     kv_tier_bytes=0, enable_prefetch=False, tool_ttl=False)  # the session alone
    try:
        runs = anyio.run(_measure, lm, cfg, prompt, reps, restores)
    except Exception as exc:  # reported, never dropped: the key is null with this reason
        return {"status": "not run", "reason": f"failed: {type(exc).__name__}: {exc}"}
    med = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {"status": "ok", "prompt_tokens": len(prompt), "reps": reps, "restores_per_rep": restores,
            "per_rep": runs, "speedup": med("speedup"), "prefill_s": med("prefill_s"),
            "restore_s": med("restore_s"), "snapshot_s": med("snapshot_s"), "snapshot_bytes": med("snapshot_bytes"),
            "restore_computed": max(x["computed"] for r in runs for x in r["restores"])}
