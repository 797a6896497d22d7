"""The step's tail on the device (engine/device_tail.py), run on the CPU: the executor leaves the
logits rows where the model made them and the core decides there, as it does on a GPU. Greedy
output equals the naive oracle token for token, with prompt-lookup drafts (verified on the
device) and with grammars (masked on the device, their drafts verified on the host); sampled
output depends on the seed only, not on the batch. The sampling kernel runs in triton's
interpreter here."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")
from agentrt.config import EngineConfig  # noqa: E402
from agentrt.constrain.grammar import GrammarFactory  # noqa: E402
from agentrt.engine.core import EngineCore  # noqa: E402
from agentrt.engine.executor import ModelExecutor  # noqa: E402
from agentrt.model.generate import generate  # noqa: E402
from agentrt.sampling import SamplingParams, make_generator  # noqa: E402
from tests.conftest import tiny_model, tiny_model_with_tokenizer  # noqa: E402
from tests.engine_util import drain, submit  # noqa: E402
from tests.test_speculation import _toolcall_like_prompts  # noqa: E402


def _core(model, **cfg) -> EngineCore:
    cfg = EngineConfig(kv_cache_tokens=32768, max_transient_seqs=64, response_cache_size=0, **cfg)
    return EngineCore(model, cfg, executor=ModelExecutor(model, device_tail=True))


def test_greedy_with_drafts_on_the_device_equals_the_oracle():
    model = tiny_model("llama")
    prompts = _toolcall_like_prompts(12, seed=2)
    params = SamplingParams(max_tokens=30)
    core = _core(model, enable_speculation=True, spec_token_budget=200)
    reqs = [submit(core, p, params) for p in prompts]
    drain(core)
    assert [r.output for r in reqs] == [generate(model, p, params) for p in prompts]
    st = core.stats()
    assert st.spec_proposed > 0 and st.spec_accepted > 0
    assert core.counters.host_syncs == 0  # (the CPU's rows are the host's: nothing to wait for)


def _sampled(seeds, batch_with=()):
    model = tiny_model("llama")
    core = _core(model, enable_speculation=False)
    prompt = list(range(20, 60))
    mine = []
    for s in seeds:
        sp = SamplingParams(max_tokens=12, temperature=4.0, top_k=100, top_p=0.99, seed=s)  # (the tiny model is peaked)
        mine.append(submit(core, prompt, sp, generator=make_generator(1000 + s)))
    for p in batch_with:
        submit(core, p, SamplingParams(max_tokens=12, temperature=1.0), generator=make_generator(7))
    drain(core)
    return [r.output for r in mine]


def test_sampled_tokens_depend_on_the_seed_not_the_batch():
    alone = _sampled([1, 2])
    batched = _sampled([1, 2], batch_with=[list(range(3, 30)), list(range(100, 111))])
    assert alone == batched
    assert alone[0] != alone[1]  # (other seeds, other tokens)


def test_constrained_rows_are_masked_on_the_device_and_equal_the_host_path():
    lm = tiny_model_with_tokenizer()
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"]}}}]
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompt = lm.tokenizer.encode("pick a city")
    outs = []
    for device_tail in (True, False):
        core = EngineCore(lm.model, EngineConfig(kv_cache_tokens=4096, response_cache_size=0),
                          executor=ModelExecutor(lm.model, device_tail=device_tail))
        r = submit(core, prompt, SamplingParams(max_tokens=40), constraint=factory.for_tools(tools, "pick"))
        drain(core)
        outs.append(r.output)
    assert outs[0] == outs[1]
    assert '"city": "' in lm.tokenizer.decode(outs[0])
