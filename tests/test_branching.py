"""Session branching on the engine: snapshot -> restore (in a fresh engine), fork with
copy-on-write, rollback; refusals (another model or dtype, garbage, missing file, busy session,
bad arguments) and no leaked page or pool id on any path. The oracle is naive single-sequence
greedy decoding of the full prompt (agentrt.model.generate). The tiny Qwen2 model is used
because its greedy continuations depend on the whole history (the tiny Llama repeats its last
token), so a wrong KV would show."""

from __future__ import annotations

import os
import random
from contextlib import aclosing

import anyio
import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.errors import ConfigError, OutOfKVMemory, PoolExhausted, SessionBusy, SnapshotMismatch
from agentrt.kv import snapshot
from agentrt.model.decoder import DecoderModel
from agentrt.model.fingerprint import model_fingerprint
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import config_of, make_hf_model, tiny_model
from tests.engine_util import assert_quiescent

P = SamplingParams(max_tokens=8)
CFG = dict(response_cache_size=0, debug_invariants=True)


def model():
    return tiny_model("qwen2")


def history(seed: int = 0, n: int = 45) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 300) for _ in range(n)]


async def check_clean(eng, sessions: int = 0) -> None:
    """Idle engine: invariants hold, pages are held only by live sessions and the radix cache,
    and exactly `sessions` session ids are taken."""
    with anyio.fail_after(30):
        while eng.stats().running or eng.stats().waiting:
            await anyio.sleep(0.01)
    await eng.run_in_step_thread(eng.core.check_invariants)
    await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
    pool = eng.core.pool
    assert pool.num_free("session") == eng.config.max_session_seqs - sessions
    assert len(eng.core.sessions) == sessions


def run(fn, m=None, **cfg):
    async def main():
        async with Engine(m or model(), EngineConfig(**{**CFG, **cfg})) as eng:
            await fn(eng)
    anyio.run(main)


async def first_turn(eng, tag: str = "a"):
    """A session after one turn on history(0): (session, prompt, completion, tokens it holds)."""
    s = await eng.open_session(tag=tag)
    c = await eng.complete(history(0), P, session=s)
    return s, history(0), c.token_ids, s.tokens


def test_snapshot_then_restore_in_a_fresh_engine_prefills_only_the_delta(tmp_path):
    m, out = model(), {}

    async def write(eng):
        s, hist, reply, held = await first_turn(eng)
        out.update(hist=hist, reply=reply, held=held, path=await s.snapshot(tmp_path / "a.snap"))
        await s.close()
        await check_clean(eng)
    run(write)
    assert out["path"] == tmp_path / "a.snap" and out["path"].is_file()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # the temp file was renamed
    full = out["hist"] + out["reply"] + [5, 6, 7]

    async def resume(eng):  # another page size: the snapshot is per token, not per page
        r = await eng.restore(str(out["path"]))
        assert r.tokens == out["held"] and eng.core.sessions[r._es.sid].tag == "a"
        c = await eng.complete(full, P, session=r)
        assert c.token_ids == generate(m, full, P)
        assert c.usage.cached_tokens == len(out["held"])
        assert c.usage.computed_prompt_tokens == len(full) - len(out["held"])
        r2 = await eng.restore(out["path"], tag="b")
        assert eng.core.sessions[r2._es.sid].tag == "b"
        await r.close()
        await r2.close()
        await check_clean(eng)
    run(resume, page_size=8)


def write_first_turn(path) -> None:
    """A snapshot at `path` of a session after one turn (first_turn)."""
    async def write(eng):
        s, *_ = await first_turn(eng)
        await s.snapshot(path)
        await s.close()
    run(write)


def test_restore_refuses_another_model_dtype_garbage_foreign_or_missing_file(tmp_path):
    path = tmp_path / "a.snap"
    write_first_turn(path)
    hf = make_hf_model("qwen2", 0)
    bf16 = DecoderModel(config_of(hf), dtype=torch.bfloat16)
    bf16.load_hf_weights(hf.state_dict())
    for other, what in ((tiny_model("qwen2", seed=1), "different weights"), (bf16, "dtype"),
                        (tiny_model("llama"), "arch")):
        async def refused(eng, what=what):
            with pytest.raises(SnapshotMismatch, match=what):
                await eng.restore(path)
            await check_clean(eng)
        run(refused, other)
    (tmp_path / "garbage").write_bytes(os.urandom(300))
    torch.save({"weights": torch.zeros(3)}, tmp_path / "foreign")
    fp = model_fingerprint(model())
    snapshot.write_snapshot(tmp_path / "bad_shape", {"tokens": [1, 2], "k": torch.zeros(1), "v": torch.zeros(1)}, fp)

    async def bad_files(eng):
        for name, what in (("garbage", "not a readable"), ("foreign", "not an agentrt"), ("bad_shape", "corrupt"),
                           ("missing", "does not exist")):
            with pytest.raises(SnapshotMismatch, match=what):
                await eng.restore(tmp_path / name)
        for bad in (123, b"a.snap", None, ""):
            with pytest.raises(ConfigError, match="path"):
                await eng.restore(bad)
        with pytest.raises(ConfigError, match="tag"):
            await eng.restore(path, tag=5)
        await check_clean(eng)
    run(bad_files)


def test_fingerprint_tells_apart_weights_and_dtype_but_not_copies():
    a, b = model_fingerprint(model()), model_fingerprint(tiny_model("qwen2", seed=1))
    assert a["config"] == b["config"] and a["dtype"] == b["dtype"] and a["weights"] != b["weights"]
    assert model_fingerprint(model()) == a


def test_fork_shares_pages_then_copies_on_write_and_both_branches_match_the_oracle():
    m = model()

    async def fn(eng):
        s, hist, reply, held = await first_turn(eng)
        child = await s.fork()
        pe, ce, alloc = s._es, child._es, eng.core.alloc
        assert child.tokens == held and ce.tag == "a" and ce.sid != pe.sid
        assert ce.seq.pages == pe.seq.pages[:len(ce.seq.pages)]
        assert all(alloc.refcount(p) == 2 for p in ce.seq.pages)  # (no radix cache here)
        await eng.run_in_step_thread(eng.core.check_invariants)
        prompts = {"parent": hist + reply + [5, 6, 7], "child": hist + reply + [200, 17]}
        got = {}

        async def turn(name, sess):
            got[name] = await eng.complete(prompts[name], P, session=sess)
        async with anyio.create_task_group() as tg:  # the branches run side by side
            tg.start_soon(turn, "parent", s)
            tg.start_soon(turn, "child", child)
        for name in prompts:
            assert got[name].token_ids == generate(m, prompts[name], P)
            assert got[name].usage.cached_tokens == len(held)
        ps, full = eng.config.page_size, len(held) // eng.config.page_size
        assert ce.seq.pages[:full] == pe.seq.pages[:full]  # full pages still shared
        assert len(held) % ps and ce.seq.pages[full] != pe.seq.pages[full]  # the partial one was copied
        grandchild = await child.fork(tag="g")
        assert eng.core.sessions[grandchild._es.sid].tag == "g"
        for sess in (s, child, grandchild):
            await sess.close()
        await check_clean(eng)
        assert alloc.num_free == alloc.num_pages  # every page id came back
    run(fn, enable_radix_cache=False)


def test_rollback_then_generate_matches_the_oracle():
    m = model()

    async def fn(eng):
        s, hist, reply, held = await first_turn(eng)
        await s.rollback(0)
        assert s.tokens == held
        await s.rollback(10)
        assert s.tokens == held[:-10]
        full = hist + reply + [5, 6, 7]
        c = await eng.complete(full, P, session=s)
        assert c.token_ids == generate(m, full, P)
        assert c.usage.cached_tokens == len(held) - 10
        for bad in (-1, 1.5, "3", True, None, len(s.tokens) + 1):
            with pytest.raises(ConfigError, match="n_tokens"):
                await s.rollback(bad)
        await s.rollback(len(s.tokens))
        assert s.tokens == []
        await s.close()
        for op in (s.rollback(0), s.fork(), s.snapshot("x.snap")):
            with pytest.raises(ConfigError, match="closed"):
                await op
        await check_clean(eng)
    run(fn, enable_radix_cache=False)


def test_a_busy_session_cannot_be_forked_rolled_back_or_snapshotted(tmp_path):
    async def fn(eng):
        s = await eng.open_session()
        long = SamplingParams(max_tokens=1000, ignore_eos=True)
        async with aclosing(eng.generate(history(1), long, session=s)) as stream:
            async for _ in stream:
                break  # the turn is running
            for op in (s.rollback(1), s.fork(), s.snapshot(tmp_path / "x.snap")):
                with pytest.raises(SessionBusy, match="wait for the turn"):
                    await op
        assert not (tmp_path / "x.snap").exists()
        await check_clean(eng, sessions=1)  # the fork's id went back
        await s.close()
        await check_clean(eng)
    run(fn, enable_speculation=False)


def test_fork_waiting_for_a_pool_slot_is_cancellable_and_leaks_nothing():
    async def fn(eng):
        s, *_ = await first_turn(eng)
        blocker = await eng.open_session()  # the pool is full now
        with anyio.move_on_after(0.1):
            await s.fork(timeout=30)
        with pytest.raises(PoolExhausted):
            await s.fork(timeout=0.05)
        await check_clean(eng, sessions=2)
        await blocker.close()
        for delay in (0, 0, 0.001, 0.003):  # cancelled before, during or after the step-thread fork
            async with anyio.create_task_group() as tg:
                tg.start_soon(s.fork)
                await anyio.sleep(delay)
                tg.cancel_scope.cancel()
            await eng.run_in_step_thread(lambda: None)  # the undo ran (the inbox is FIFO)
            extra = [x for x in eng.core.sessions.values() if x is not s._es]
            for es in extra:  # a fork that completed before the cancel reached it is a session
                await eng.close_session(es)
            await check_clean(eng, sessions=1)
        await s.close()
    run(fn, max_session_seqs=2)


def test_bad_arguments_and_an_oversized_restore_raise_typed_errors(tmp_path):
    path = tmp_path / "a.snap"

    async def fn(eng):
        s, *_ = await first_turn(eng)
        with pytest.raises(ConfigError, match="tag"):
            await s.fork(tag=3)
        with pytest.raises(ConfigError, match="timeout"):
            await s.fork(timeout=-1)
        with pytest.raises(ConfigError, match="does not exist"):
            await s.snapshot(tmp_path / "no_dir" / "a.snap")
        await s.snapshot(path)
        empty = await eng.open_session()
        await empty.snapshot(tmp_path / "empty.snap")
        r = await eng.restore(tmp_path / "empty.snap")
        assert r.tokens == []
        for sess in (s, empty, r):
            await sess.close()
        await check_clean(eng)
    run(fn)

    async def too_small(eng):  # 52 tokens need 4 pages of 16; the pool has 2
        with pytest.raises(OutOfKVMemory, match="kv_cache_tokens"):
            await eng.restore(path)
        await check_clean(eng)
    run(too_small, kv_cache_tokens=32)


def test_a_snapshot_with_any_byte_changed_is_refused(tmp_path):
    """One byte flipped at 64 offsets spread over the file (header, pickle, KV data, zip
    trailer): every one is refused with SnapshotMismatch, never restored silently; the intact
    file still restores."""
    path = tmp_path / "a.snap"
    write_first_turn(path)
    data = path.read_bytes()
    fp = model_fingerprint(model())
    assert snapshot.read_snapshot(path, fp)["tokens"]
    bad = tmp_path / "bad.snap"
    for i in range(64):
        off = (i * (len(data) - 1)) // 63
        flipped = bytearray(data)
        flipped[off] ^= 0x5A
        bad.write_bytes(bytes(flipped))
        with pytest.raises(SnapshotMismatch):
            snapshot.read_snapshot(bad, fp)
