"""The async Engine facade: streaming, sessions, cancellation, pool exhaustion, bad input."""

from __future__ import annotations

from contextlib import aclosing

import anyio
import pytest

from agentrt.config import EngineConfig
from agentrt.engine.engine import Engine
from agentrt.errors import ConfigError, ContextLengthExceeded, OutOfKVMemory, PoolExhausted
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import assert_quiescent


def _run(fn, **cfg):
    async def main():
        async with Engine(tiny_model("llama"), EngineConfig(**cfg)) as eng:
            await fn(eng)
            await _settle(eng)
            await eng.run_in_step_thread(eng.core.check_invariants)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
    anyio.run(main)


async def _settle(eng):
    with anyio.fail_after(30):
        while eng.stats().running or eng.stats().waiting:
            await anyio.sleep(0.01)


def test_stream_matches_naive_and_reports_usage():
    prompt = list(range(3, 60))

    async def fn(eng):
        got = []
        async with aclosing(eng.generate(prompt, SamplingParams(max_tokens=9))) as stream:
            async for ev in stream:
                got.extend(ev.token_ids)
                last = ev
        assert got == generate(tiny_model("llama"), prompt, SamplingParams(max_tokens=9))
        assert last.finish_reason == "length" and last.usage.prompt_tokens == len(prompt)
    _run(fn)


def test_cancel_mid_prefill_frees_everything():
    async def fn(eng):
        async def consume():
            await eng.complete(list(range(1, 290)) * 6, SamplingParams(max_tokens=4))
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            with anyio.fail_after(30):
                while eng.stats().prompt_computed == 0:
                    await anyio.sleep(0.001)
            assert eng.stats().running == 1  # still prefilling, chunk by chunk
            tg.cancel_scope.cancel()
    _run(fn, chunk_min=8, chunk_max=8, n_batch=8)


def test_cancel_mid_decode_frees_everything():
    async def fn(eng):
        n = 0
        async with aclosing(eng.generate([5, 6, 7], SamplingParams(max_tokens=200, ignore_eos=True))) as s:
            async for ev in s:
                n += len(ev.token_ids)
                if n >= 3:
                    break
        assert n == 3
    _run(fn)


def test_pool_exhaustion_raises_after_timeout_and_leaks_nothing():
    async def fn(eng):
        s1 = await eng.open_session()
        with pytest.raises(PoolExhausted):
            await eng.open_session(timeout=0.05)
        await s1.close()
        s2 = await eng.open_session(timeout=0.05)
        await s2.close()
    _run(fn, max_session_seqs=1)


def test_too_long_prompt_fails_before_any_work():
    async def fn(eng):
        with pytest.raises(ContextLengthExceeded):
            await eng.complete([1] * 2040, SamplingParams(max_tokens=16))
        with pytest.raises(OutOfKVMemory):
            await eng.complete([1] * 300, SamplingParams(max_tokens=16))
        with pytest.raises(ConfigError):
            await eng.complete([], SamplingParams())
        async with await eng.open_session() as s:
            with pytest.raises(ContextLengthExceeded):
                await eng.complete([2] * 2049, session=s)
        assert eng.stats().steps == 0
    _run(fn, kv_cache_tokens=256)


def test_sessions_reuse_kv_across_turns():
    async def fn(eng):
        async with await eng.open_session(tag="a") as s:
            hist = list(range(10, 80))
            for turn in range(3):
                c = await eng.complete(hist, SamplingParams(max_tokens=5), session=s)
                assert c.token_ids == generate(tiny_model("llama"), hist, SamplingParams(max_tokens=5))
                if turn:
                    assert c.usage.cached_tokens == len(hist) - 8
                hist = hist + c.token_ids + list(range(100 + turn, 107 + turn))
                assert s.tokens == hist[: len(s.tokens)]
    _run(fn)
