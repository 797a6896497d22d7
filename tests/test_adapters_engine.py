"""LoRA adapters in the engine, against naive single-sequence greedy decoding under the same
adapter (model/generate.py): token-identical alone, in one batch with other adapters and the
base model, after a radix hit and after a snapshot restore. Isolation: KV made under one adapter
never serves another (a cache keyed by tokens alone fails these tests), a name reloaded with new
weights recomputes, the same weights under another name share; an activated LoRA reuses exactly
the base model's KV before its invocation tokens and not one token past it.

The base is tests/conftest.py's tiny_native (int8 weights, float16 KV, the fused kernels); the
adapters are PEFT's, on the same weights (tests/test_adapters.py builds them)."""

from __future__ import annotations

import anyio
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.adapters import read_peft
from agentrt.errors import SnapshotMismatch, UnknownAdapter
from agentrt.model.generate import generate
from tests.conftest import make_hf_model, tiny_native
from tests.test_adapters import ids, make_adapter

pytest.importorskip("peft")

NATIVE = dict(hidden_size=192, intermediate_size=320, num_hidden_layers=2, num_attention_heads=3,
              num_key_value_heads=1)  # (tiny_native's shapes and seed: the same weights)
GREEDY = SamplingParams(max_tokens=10)
CONFIG = EngineConfig(kv_cache_tokens=4096, response_cache_size=0)
INVOCATION = [17, 99, 5]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(model, {name: adapter dir}): three LoRAs (one rank 8 on attention only) and an aLoRA."""
    root = tmp_path_factory.mktemp("adapters")
    hf = make_hf_model("llama", seed=7, **NATIVE)
    dirs = {}
    for i, extra in enumerate([{}, {"r": 8, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}, {},
                               {"alora_invocation_tokens": INVOCATION, "task_type": "CAUSAL_LM"}]):
        name = ["a", "b", "c", "checker"][i]
        make_adapter(hf, root / name, seed=40 + i, **extra)
        dirs[name] = root / name
    return tiny_native("llama"), dirs


def oracle(model, dirs, name, prompt):
    adapter = None if name is None else read_peft(dirs[name], model.cfg, name)
    return generate(model, prompt, GREEDY, adapter=adapter)


def run(model, dirs, fn, config=CONFIG):
    async def main():
        async with Engine(model, config) as engine:
            for name, path in dirs.items():
                await engine.load_adapter(name, path)
            return await fn(engine)
    return anyio.run(main)


def test_alone_and_batched_with_other_adapters_equal_the_oracle(setup):
    model, dirs = setup
    prompts = {name: ids(20 + 3 * i, seed=60 + i) for i, name in enumerate(["a", "b", "c", None])}
    want = {name: oracle(model, dirs, name, p) for name, p in prompts.items()}
    assert len(set(map(tuple, want.values()))) == 4  # (the adapters change the tokens)

    async def batched(engine):
        out = {}

        async def one(name):
            out[name] = (await engine.complete(prompts[name], GREEDY, adapter=name)).token_ids
        async with anyio.create_task_group() as tg:
            for name in prompts:
                tg.start_soon(one, name)
        alone = {name: (await engine.complete(prompts[name], GREEDY, adapter=name)) for name in prompts}
        await engine.run_in_step_thread(engine.core.check_invariants)
        return out, alone
    out, alone = run(model, dirs, batched)
    assert out == want
    assert {n: c.token_ids for n, c in alone.items()} == want  # (after a radix hit: same tokens)
    assert all(c.usage.cached_tokens > 0 for c in alone.values())


def test_kv_of_one_adapter_never_serves_another(setup):
    model, dirs = setup
    prompt = ids(40, seed=70)

    async def main(engine):
        first = await engine.complete(prompt, GREEDY, adapter="a")
        others = {n: await engine.complete(prompt, GREEDY, adapter=n) for n in ("b", None)}
        await engine.load_adapter("a-again", dirs["a"])  # the same weights under another name: shared
        same = await engine.complete(prompt, GREEDY, adapter="a-again")
        await engine.load_adapter("a", dirs["c"])  # other weights under the old name: recomputed
        reloaded = await engine.complete(prompt, GREEDY, adapter="a")
        return first, others, same, reloaded
    first, others, same, reloaded = run(model, dirs, main)
    assert all(c.usage.cached_tokens == 0 for c in others.values())
    assert same.usage.cached_tokens > 0 and same.token_ids == first.token_ids
    assert reloaded.usage.cached_tokens == 0
    assert reloaded.token_ids == oracle(model, dirs, "c", prompt)


def test_sessions_take_an_adapter_and_snapshots_keep_it(setup, tmp_path):
    model, dirs = setup
    prompt = ids(30, seed=80)
    turn2 = prompt + oracle(model, dirs, "b", prompt) + ids(5, seed=81)

    async def main(engine):
        async with await engine.open_session(adapter="b") as s:
            await engine.complete(prompt, GREEDY, session=s)
            await s.snapshot(tmp_path / "b.kv")
        async with await engine.restore(tmp_path / "b.kv") as s2:
            out = await engine.complete(turn2, GREEDY, session=s2)
        await engine.unload_adapter("b")
        with pytest.raises(SnapshotMismatch, match="not loaded"):
            await engine.restore(tmp_path / "b.kv")
        with pytest.raises(UnknownAdapter, match="'b'"):
            await engine.complete(prompt, GREEDY, adapter="b")
        return out
    out = run(model, dirs, main)
    assert out.token_ids == oracle(model, dirs, "b", turn2)
    assert out.usage.cached_tokens >= len(prompt)  # (restored: no prefill of the first turn)


def test_activated_lora_reuses_the_base_kv_before_its_invocation_only(setup):
    model, dirs = setup
    history = ids(45, seed=90)
    check = history + INVOCATION + ids(4, seed=91)
    start = len(history)

    async def main(engine):
        async with await engine.open_session() as s:  # the base model's turn, then the checker's
            await engine.complete(history, GREEDY, session=s)
            checker = await engine.complete(check, GREEDY, session=s, adapter="checker")
            base_again = await engine.complete(check, GREEDY, session=s)
        transient = await engine.complete(check, GREEDY, adapter="checker")  # (from the radix tree)
        return checker, base_again, transient
    checker, base_again, transient = run(model, dirs, main)
    assert checker.token_ids == transient.token_ids == oracle(model, dirs, "checker", check)
    assert checker.usage.cached_tokens == start  # exactly the base prefix, not one token past it
    assert base_again.usage.cached_tokens == start  # (and the base turn after it recomputes the rest)
    assert base_again.token_ids == oracle(model, dirs, None, check)
    assert transient.usage.cached_tokens >= start - 16 and transient.usage.cached_tokens <= len(check) - 1
