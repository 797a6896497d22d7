"""Fault isolation in the step and the engine's lifecycle under faults (issue 13).

A fault attributable to one request (its grammar, its sampling row, its draft) fails that
request only, with a typed error to its caller; the others stay token-identical to naive greedy
decoding and nothing leaks. A step thread that dies anyway answers every pending and later call
with EngineFailed at once. A session belongs to one engine. Engine exit wakes pool waiters."""

from __future__ import annotations

import random
import time

import anyio
import pytest

import agentrt.engine.postprocess as post_mod
import agentrt.engine.sample_step as step_mod
import agentrt.scheduling.scheduler as sched_mod
from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.engine import Engine
from agentrt.errors import AgentrtError, ConfigError, EngineClosed, EngineFailed, PoolExhausted
from agentrt.model.generate import generate
from agentrt.records.constraint import LogitsConstraint
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import assert_quiescent, drain, submit

V = 301


def _prompts(n, length=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, V) for _ in range(length + 7 * i)] for i in range(n)]


class RaisingConstraint(LogitsConstraint):
    """A grammar stand-in that allows everything, then raises on its n-th mask."""

    def __init__(self, fail_at: int = 3):
        self.calls, self.fail_at = 0, fail_at

    def mask_logits(self, logits):
        self.calls += 1
        if self.calls >= self.fail_at:
            raise RuntimeError("grammar state corrupt")
        return logits

    def advance(self, token: int) -> None:
        pass

    def is_terminated(self) -> bool:
        return False

    def accepts_prefix(self, draft) -> int:
        return len(draft)


def _core(**cfg):
    return EngineCore(tiny_model("llama"), EngineConfig(debug_invariants=True, response_cache_size=0, **cfg))


def _check_isolated(core, reqs, events, bad):
    """reqs[bad] ended with "error" and a typed error; the others match naive greedy."""
    model = tiny_model("llama")
    for i, r in enumerate(reqs):
        if i == bad:
            assert r.finish_reason == "error"
            errs = [e.error for e in events[r.rid] if e.finish_reason == "error"]
            assert len(errs) == 1 and isinstance(errs[0], AgentrtError)
        else:
            assert r.finish_reason == "length"
            assert r.output == generate(model, r.prompt, r.params)


def _submit_all(core, prompts, params, kw_of=None):
    kw_of = kw_of or {}
    events: dict[int, list] = {}
    reqs = []
    for i, p in enumerate(prompts):
        seq_id = core.pool.acquire("transient", 0)
        box: list = []
        r = core.add_request(list(p), params[i], box.append, seq_id=seq_id, **kw_of.get(i, {}))
        events[r.rid] = box
        reqs.append(r)
    return reqs, events


def test_a_raising_grammar_fails_only_its_request():
    core = _core()
    prompts = _prompts(3)
    params = [SamplingParams(max_tokens=8)] * 3
    reqs, events = _submit_all(core, prompts, params, {1: dict(constraint=RaisingConstraint(3))})
    drain(core)
    _check_isolated(core, reqs, events, bad=1)
    # the tokens sampled before the grammar broke were delivered
    assert [t for e in events[reqs[1].rid] for t in e.token_ids] == reqs[1].output


def test_a_sampling_failure_on_one_row_fails_only_that_request(monkeypatch):
    """Sampling raising for one row (as NaN probabilities do), greedy and sampled rows both."""
    real = step_mod.sample_batch

    def flaky(logits, params, gens, argmax):
        if any(p.seed == 666 for p in params):
            raise RuntimeError("probability tensor contains either inf, nan or element < 0")
        return real(logits, params, gens, argmax)

    monkeypatch.setattr(step_mod, "sample_batch", flaky)
    for bad_params in (SamplingParams(max_tokens=8, seed=666),  # a greedy row: batched argmax
                       SamplingParams(max_tokens=8, temperature=0.8, seed=666)):  # a sampled row
        core = _core()
        prompts = _prompts(4, seed=1)
        params = [SamplingParams(max_tokens=8)] * 4
        params[2] = bad_params
        reqs, events = _submit_all(core, prompts, params)
        drain(core)
        _check_isolated(core, reqs, events, bad=2)
        assert reqs[2].output == []


def test_a_bad_draft_fails_only_its_request_and_rolls_back_its_kv(monkeypatch):
    """A draft that breaks verification: its request (on a session) fails, the draft's KV is
    rolled back, the session stays usable and exact on its next turn."""
    real_choose, real_verify = sched_mod.choose_draft, post_mod.verify_draft

    def choose(r, *a):
        return [5, 6, 7] if r.tag == "bad" else real_choose(r, *a)

    def verify(r, *a):
        if r.tag == "bad":
            raise TypeError("slice indices must be integers")
        return real_verify(r, *a)

    monkeypatch.setattr(sched_mod, "choose_draft", choose)
    monkeypatch.setattr(post_mod, "verify_draft", verify)
    core = _core()
    sid = core.pool.acquire("session", 0)
    sess = core.open_session(sid, tag="bad")
    prompts = _prompts(3, seed=2)
    params = [SamplingParams(max_tokens=8)] * 3
    reqs, events = _submit_all(core, prompts[:2], params[:2])
    bad_box: list = []
    bad = core.add_request(prompts[2], params[2], bad_box.append, session=sess)
    events[bad.rid] = bad_box
    drain(core)
    _check_isolated(core, reqs + [bad], events, bad=2)
    assert sess.seq.tokens == prompts[2] and not sess.busy  # the prefill's KV, no draft past it
    assert len(sess.seq.pages) == core.kvm.pages_for(len(prompts[2]))
    # the session's next turn is exact
    monkeypatch.setattr(sched_mod, "choose_draft", real_choose)
    monkeypatch.setattr(post_mod, "verify_draft", real_verify)
    again = submit(core, prompts[2] + [9, 10], SamplingParams(max_tokens=6), session=sess)
    drain(core)
    assert again.output == generate(tiny_model("llama"), prompts[2] + [9, 10], SamplingParams(max_tokens=6))
    core.close_session(sess)
    assert_quiescent(core)


def test_a_failing_draft_choice_fails_only_its_request(monkeypatch):
    real = sched_mod.choose_draft

    def choose(r, *a):
        if r.tag == "bad":
            raise TypeError("slice indices must be integers or None")
        return real(r, *a)

    monkeypatch.setattr(sched_mod, "choose_draft", choose)
    core = _core()
    prompts = _prompts(3, seed=3)
    params = [SamplingParams(max_tokens=8)] * 3
    reqs, events = _submit_all(core, prompts, params, {0: dict(tag="bad")})
    drain(core)
    _check_isolated(core, reqs, events, bad=0)


def _engine(**cfg):
    return Engine(tiny_model("llama"), EngineConfig(debug_invariants=True, response_cache_size=0, **cfg))


async def _settle(eng):
    with anyio.fail_after(30):
        while eng.stats().running or eng.stats().waiting:
            await anyio.sleep(0.01)


def test_a_raising_grammar_raises_from_its_stream_and_the_others_continue():
    model = tiny_model("llama")
    prompts = _prompts(3, seed=4)
    sp = SamplingParams(max_tokens=10)

    async def main():
        async with _engine() as eng:
            out: dict = {}

            async def run(i):
                kw = {"constraint": RaisingConstraint(4)} if i == 1 else {}
                try:
                    out[i] = (await eng.complete(prompts[i], sp, **kw)).token_ids
                except AgentrtError as e:
                    out[i] = e

            async with anyio.create_task_group() as tg:
                for i in range(3):
                    tg.start_soon(run, i)
            assert isinstance(out[1], AgentrtError) and "request" in str(out[1])
            assert isinstance(out[1].__cause__, RuntimeError)
            assert out[0] == generate(model, prompts[0], sp) and out[2] == generate(model, prompts[2], sp)
            # the engine goes on: a later request is exact
            assert (await eng.complete(prompts[1], sp)).token_ids == generate(model, prompts[1], sp)
            await _settle(eng)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
    anyio.run(main)


def test_a_dead_step_thread_fails_every_pending_and_future_call_with_engine_failed():
    """A bug not attributable to one request kills the step thread: the live streams, a pool
    waiter, and every later call get EngineFailed at once (no hang)."""
    async def main():
        async with _engine(max_transient_seqs=1, acquire_timeout=60) as eng:
            real_step = eng.core.step

            def step():
                if eng.core.counters.steps >= 3:
                    raise RuntimeError("decref of free page 7")
                return real_step()

            eng.core.step = step
            got: dict = {}

            async def live():
                try:
                    await eng.complete(_prompts(1)[0], SamplingParams(max_tokens=50))
                except Exception as e:
                    got["live"] = e

            async def waiter():  # waits for the one transient slot
                try:
                    await eng.complete([1, 2, 3], SamplingParams(max_tokens=2))
                except Exception as e:
                    got["waiter"] = e

            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(live)
                    await anyio.sleep(0.02)
                    tg.start_soon(waiter)
            assert isinstance(got["live"], EngineFailed), got
            assert isinstance(got["waiter"], EngineFailed), got
            assert isinstance(got["live"].__cause__, RuntimeError)
            with anyio.fail_after(2):
                with pytest.raises(EngineFailed):
                    await eng.open_session()
                with pytest.raises(EngineFailed):
                    await eng.complete([1, 2], SamplingParams(max_tokens=2))
        assert isinstance(EngineFailed("x"), EngineClosed)
    anyio.run(main)


def test_a_session_of_another_engine_is_rejected_with_config_error():
    """It used to kill the other engine's step thread (decref of free page) and hang it."""
    model = tiny_model("llama")
    prompt = _prompts(1, seed=5)[0]
    sp = SamplingParams(max_tokens=6)

    async def main():
        async with _engine() as a, _engine() as b:
            async with await a.open_session() as sa:
                await a.complete(prompt, sp, session=sa)
                with anyio.fail_after(10):
                    with pytest.raises(ConfigError, match="another engine|on this engine"):
                        await b.complete(prompt + [3], sp, session=sa)
                    with pytest.raises(ConfigError):
                        await b.run_in_step_thread(lambda: b.core.close_session(sa._es))
                    # both engines go on
                    assert (await b.complete(prompt, sp)).token_ids == generate(model, prompt, sp)
                    got = await a.complete(prompt + [3], sp, session=sa)
                    assert got.token_ids == generate(model, prompt + [3], sp)
                    async with await b.open_session() as sb:
                        await b.complete(prompt, sp, session=sb)
            for eng in (a, b):
                await _settle(eng)
                await eng.run_in_step_thread(eng.core.check_invariants)
                await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
                assert eng.core.pool.num_free("session") == eng.config.max_session_seqs
    anyio.run(main)


def test_open_session_wait_is_cancellable_by_the_callers_timeout():
    """It used to wait in a shielded scope no timeout could end; the id it took is given back."""
    async def main():
        async with _engine(max_session_seqs=2) as eng:
            real_open = eng.core.open_session

            def slow_open(*a, **kw):
                time.sleep(1.0)  # the step thread is busy
                return real_open(*a, **kw)

            eng.core.open_session = slow_open
            t0 = time.monotonic()
            with anyio.move_on_after(0.1) as scope:
                await eng.open_session()
            assert scope.cancelled_caught and time.monotonic() - t0 < 0.6
            eng.core.open_session = real_open
            with anyio.fail_after(10):
                while eng.core.pool.num_free("session") != 2:  # the undo runs after the open
                    await anyio.sleep(0.01)
            await eng.run_in_step_thread(eng.core.check_invariants)
            assert not eng.core.sessions
            async with await eng.open_session() as s:  # still usable
                await eng.complete([1, 2, 3], SamplingParams(max_tokens=2), session=s)
    anyio.run(main)


def test_open_session_waiting_on_a_full_pool_gets_engine_closed_when_the_engine_exits():
    """It used to wait the whole acquire_timeout and then raise PoolExhausted."""
    async def main():
        got: dict = {}

        async def waiter(eng, kind):
            try:
                if kind == "session":
                    await eng.open_session()
                else:
                    await eng.complete([1, 2, 3], SamplingParams(max_tokens=2))
            except Exception as e:
                got[kind] = (e, time.monotonic())

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                async with _engine(max_session_seqs=1, max_transient_seqs=1, acquire_timeout=30) as eng:
                    await eng.open_session()  # the only session slot
                    eng.core.pool.acquire("transient", 0)  # and the only transient one
                    tg.start_soon(waiter, eng, "session")
                    tg.start_soon(waiter, eng, "transient")
                    await anyio.sleep(0.1)
                    t0 = time.monotonic()
        for kind in ("session", "transient"):
            e, t = got[kind]
            assert isinstance(e, EngineClosed) and not isinstance(e, PoolExhausted), e
            assert t - t0 < 1.0
    anyio.run(main)
