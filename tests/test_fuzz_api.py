"""Fuzz the public engine API (issue 13): random valid and invalid calls, cancellations and
session closes on a tiny model. Whatever happens, a caller only ever sees agentrt's typed errors,
no call hangs, and the pool / radix / page invariants hold after every operation and at the end."""

from __future__ import annotations

import math

import anyio
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.errors import AgentrtError
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import assert_quiescent

VOCAB = 49152

_prompt = st.one_of(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40),  # valid
    st.sampled_from(["empty", "negative", "too_big", "float", "str", "none", "tensor", "generator", "bool"]),
)
_params = st.one_of(
    st.builds(dict, max_tokens=st.integers(1, 12), temperature=st.sampled_from([0.0, 0.7, 1.0]),
              seed=st.integers(0, 5)),
    st.sampled_from([{"temperature": math.nan}, {"temperature": -1.0}, {"max_tokens": 2.5}, {"max_tokens": "5"},
                     {"max_tokens": 0}, {"top_p": 2.0}, {"top_k": -3}, "dict", "none"]),
)
_op = st.one_of(
    st.tuples(st.just("generate"), _prompt, _params, st.booleans(), st.sampled_from([None, 0.0, 0.01, 5.0])),
    st.tuples(st.just("open")), st.tuples(st.just("close"), st.integers(0, 3)),
)


def _make_prompt(kind):
    if isinstance(kind, list):
        return kind
    return {"empty": [], "negative": [-1, 2], "too_big": [VOCAB + 5], "float": [1.5, 2.0], "str": "hello",
            "none": None, "tensor": torch.tensor([1, 2, 3]), "generator": (i for i in [1, 2]),
            "bool": [True, 3]}[kind]


def _make_params(kind):
    if kind == "dict":
        return {"max_tokens": 4}
    if kind == "none":
        return None
    return SamplingParams(**kind)  # may raise ConfigError: that is the boundary check


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=10))
def test_random_calls_give_typed_errors_and_keep_invariants(ops):
    lm = tiny_model_with_tokenizer()
    untyped: list[BaseException] = []

    async def one(eng, sessions, op):
        if op[0] == "open":
            sessions.append(await eng.open_session(timeout=0.0))
        elif op[0] == "close":
            if sessions:
                await sessions.pop(op[1] % len(sessions)).close()
        else:
            _, prompt, params, use_session, timeout = op
            session = sessions[0] if use_session and sessions else None
            with anyio.move_on_after(timeout) if timeout is not None else _nullcontext():
                await eng.complete(_make_prompt(prompt), _make_params(params), session=session)

    async def main():
        cfg = EngineConfig(kv_cache_tokens=2048, max_session_seqs=2, response_cache_size=0, debug_invariants=True)
        async with Engine(lm, cfg) as eng:
            sessions: list = []
            for op in ops:
                try:
                    with anyio.fail_after(60):  # never a hang
                        await one(eng, sessions, op)
                except AgentrtError:
                    pass
                except Exception as exc:  # noqa: BLE001 - the point: nothing untyped may escape
                    untyped.append(exc)
                await eng.run_in_step_thread(eng.core.check_invariants)
            for s in sessions:
                await s.close()
            with anyio.fail_after(30):
                while eng.stats().running or eng.stats().waiting:
                    await anyio.sleep(0.01)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))

    anyio.run(main)
    assert not untyped, [f"{type(e).__name__}: {e}" for e in untyped]


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_fuzz_helpers_cover_the_invalid_kinds():
    with pytest.raises(AgentrtError):
        _make_params({"temperature": math.nan})
    assert _make_prompt("empty") == []
