"""The disk KV tier (kv/disk.py) on a real (tiny, random) model: a restarted engine over the same
state dir gets a session's KV back and computes only the new tokens.

Oracle: naive single-sequence greedy decoding (agentrt.model.generate) of the whole prompt:
what a restored session answers must be token-identical. And what must never happen: another
tenant's or adapter's records matched, a corrupt record used, a torn write visible.
"""

from __future__ import annotations

import functools

import anyio
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.model.generate import generate
from agentrt.state import open_store
from agentrt.state.records import record_path
from tests.conftest import tiny_model

pytestmark = pytest.mark.anyio
P = SamplingParams(max_tokens=6, temperature=0.0)
HIST = [(7 * i + 3) % 250 + 5 for i in range(300)]


def _cfg(d, **kw) -> EngineConfig:
    return EngineConfig(kv_cache_tokens=4096, state_dir=str(d), debug_invariants=True, response_cache_size=0, **kw)


async def _turns(cfg, prompts, salt=None, key="s1", model=None):
    """One engine, one session: each prompt continues the previous turn (prompt + output); returns
    (last completion, the whole conversation's tokens, the engine's stats)."""
    toks, c = [], None
    async with Engine(model or tiny_model("llama"), cfg) as eng:
        async with await eng.open_session(key=key, cache_salt=salt) as s:
            for p in prompts:
                toks = toks + p
                c = await eng.complete(toks, P, session=s)
                toks = toks + c.token_ids
        eng.core.disk.flush()
        eng.core.disk.check_invariants()
        return c, toks, eng.stats()


async def test_a_restarted_engine_restores_a_session_and_computes_only_new_tokens(tmp_path):
    _, toks, first = await _turns(_cfg(tmp_path), [HIST, [9, 8, 7]])
    assert first.prompt_restored == 0
    new = [11, 12, 13, 14]
    c, _, st = await _turns(_cfg(tmp_path), [toks + new])  # a new process: nothing in memory
    want = generate(tiny_model("llama"), toks + new, P)
    assert c.token_ids == want
    assert st.prompt_restored >= len(toks) - 1 and c.usage.computed_prompt_tokens <= len(new) + 1
    store = open_store(tmp_path)
    row = store.get_session("s1")
    # (the KV of everything but the last sampled token: it was never fed through the model)
    assert row is not None and row.n_tokens == len(toks) + len(new) + len(c.token_ids) - 1
    # each write added only what the disk lacked (a turn's write not started yet is replaced by the next's)
    assert sum(r.n for r in store.kv_get(row.records)) == row.n_tokens and len(row.records) in (2, 3)


async def test_a_prefix_shared_by_sessions_is_written_once(tmp_path):
    await _turns(_cfg(tmp_path), [HIST + [1, 2, 3]], key="a")
    await _turns(_cfg(tmp_path), [HIST + [4, 5, 6]], key="b")
    store = open_store(tmp_path)
    rows = store.kv_all()
    written = sum(r.n for r in rows)
    assert written < 2 * len(HIST)  # the 300 shared tokens once, then each session's own run
    b = store.get_session("b")
    assert store.kv_get(b.records)[-1].start >= len(HIST)  # b's record starts where it diverged


async def test_tenants_and_adapters_never_reach_each_others_records(tmp_path):
    _, toks, _ = await _turns(_cfg(tmp_path), [HIST], salt="tenant-a")
    _, _, other = await _turns(_cfg(tmp_path), [toks + [1]], salt="tenant-b", key="s2")
    assert other.prompt_restored == 0
    _, _, same = await _turns(_cfg(tmp_path), [toks + [1]], salt="tenant-a", key="s3")
    assert same.prompt_restored >= len(HIST)


async def test_another_model_never_reads_the_records(tmp_path):
    _, toks, _ = await _turns(_cfg(tmp_path), [HIST])
    _, _, st = await _turns(_cfg(tmp_path), [toks + [1]], model=tiny_model("llama", seed=1))
    assert st.prompt_restored == 0


async def test_a_corrupt_record_is_recomputed_never_used(tmp_path):
    _, toks, _ = await _turns(_cfg(tmp_path), [HIST])
    store = open_store(tmp_path)
    (row,) = store.kv_all()
    path = record_path(tmp_path, row.id)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0x40  # one flipped bit in the KV
    path.write_bytes(bytes(raw))
    c, _, st = await _turns(_cfg(tmp_path), [toks + [1, 2]])
    assert st.prompt_restored == 0 and c.token_ids == generate(tiny_model("llama"), toks + [1, 2], P)
    assert row.id not in {r.id for r in store.kv_all()} and not path.exists()  # (deleted, then rewritten whole)


async def test_a_torn_write_is_never_visible(tmp_path):
    """A crash between the write and the rename leaves a temporary file no index row names (swept
    at the next open); a record cut short under its final name fails its checksum."""
    _, toks, _ = await _turns(_cfg(tmp_path), [HIST])
    store = open_store(tmp_path)
    (row,) = store.kv_all()
    path = record_path(tmp_path, row.id)
    tmp = path.parent / f".{path.name}.abc.tmp"
    tmp.write_bytes(path.read_bytes()[:1000])
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    c, _, st = await _turns(_cfg(tmp_path), [toks + [3]])
    assert not tmp.exists() and st.prompt_restored == 0
    assert c.token_ids == generate(tiny_model("llama"), toks + [3], P)


async def test_the_budget_bounds_the_disk_in_lru_order(tmp_path):
    one = 2 * 2 * 300 * 4 * 16 * 4  # (about one 300-token record of the tiny model: 2 layers, K and V)
    cfg = _cfg(tmp_path, disk_budget_bytes=int(2.5 * one), eviction_policy="lru")
    for i in range(5):
        await _turns(cfg, [[(t + 31 * i) % 250 + 5 for t in HIST]], key=f"k{i}")
    store = open_store(tmp_path)
    rows = store.kv_all()
    assert store.kv_bytes() <= cfg.disk_budget_bytes + max(r.nbytes for r in rows)
    assert {store.kv_get([r.id])[0].id for r in rows} >= set(store.get_session("k4").records)  # the newest stays


async def test_writes_never_leak_a_page_and_the_engine_closes_with_them_done(tmp_path):
    async with Engine(tiny_model("llama"), _cfg(tmp_path)) as eng:
        sessions = [await eng.open_session(key=f"w{i}") for i in range(4)]
        async with anyio.create_task_group() as tg:
            for i, s in enumerate(sessions):
                tg.start_soon(functools.partial(eng.complete, HIST[: 100 + 40 * i], P, session=s))
        await eng.run_in_step_thread(eng.core.check_invariants)  # (pages of writes in flight: counted)
        for s in sessions:
            await s.close()
    # closed: every queued write finished and gave its pages back
    assert not eng.core.disk.held
    eng.core.check_invariants()
    assert len(open_store(tmp_path).sessions()) == 4


def test_state_settings_are_checked():
    from agentrt.errors import ConfigError

    with pytest.raises(ConfigError, match="state_dir"):
        EngineConfig(state_dir=3)
    with pytest.raises(ConfigError, match="disk_budget_bytes"):
        EngineConfig(disk_budget_bytes=-1)
