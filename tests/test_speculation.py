"""Prompt-lookup speculation: greedy output identical to plain decoding; sampled output keeps
its distribution; and the prompt-deterministic response cache."""

from __future__ import annotations

import math
import random
from collections import Counter

import anyio
import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.engine import Engine
from agentrt.model.generate import prompt_logits
from agentrt.sampling import SamplingParams, make_generator
from agentrt.sampling.speculative import NgramIndex
from tests.conftest import small_vocab_model, tiny_model
from tests.engine_util import drain, submit


def test_ngram_index_drafts_from_the_latest_earlier_occurrence():
    idx = NgramIndex(1, 3)
    idx.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2])
    assert idx.draft(3) == [3, 5, 7]  # "1 2" last seen before at 5..6, followed by 3 5 7
    idx.extend([3])
    assert idx.draft(2) == [5, 7]
    assert NgramIndex().draft(4) == []


def _toolcall_like_prompts(n, seed, vocab=301):
    """Prompts that repeat segments, as tool calls repeat names, keys and values."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        names = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 6))] for _ in range(4)]
        body = []
        for _ in range(rng.randrange(3, 9)):
            body += rng.choice(names) + [rng.randrange(vocab)]
        out.append(body)
    return out


def _run(model, prompts, params, **cfg):
    core = EngineCore(model, EngineConfig(kv_cache_tokens=32768, max_transient_seqs=64, **cfg))
    reqs = [submit(core, p, params) for p in prompts]
    drain(core)
    return [r.output for r in reqs], core.stats()


def test_speculation_is_token_identical_on_tiny_model():
    model = tiny_model("llama")
    prompts = _toolcall_like_prompts(50, seed=1)
    params = SamplingParams(max_tokens=40)
    on, st = _run(model, prompts, params, enable_speculation=True, response_cache_size=0,
                  spec_token_budget=400)
    off, _ = _run(model, prompts, params, enable_speculation=False, response_cache_size=0)
    assert on == off
    assert st.spec_proposed > 0 and st.spec_accepted > 0


@pytest.mark.embedded
@pytest.mark.slow
def test_speculation_is_token_identical_on_embedded_model(embedded):
    from agentrt.conversation.chat_format import ChatFormat

    fmt = ChatFormat(embedded.tokenizer)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Seoul", "Rome", "Dakar"]
    asks = ["What is the weather in {}?", "Call get_weather for {}.", "Is it raining in {}?",
            "Use the tool: weather of {} please.", "{} weather, as a tool call."]
    prompts = [fmt.encode([{"role": "user", "content": a.format(c)}], tools=tools)
               for a in asks for c in cities]
    assert len(prompts) == 50
    params = SamplingParams(max_tokens=24)
    on, st = _run(embedded.model, prompts, params, enable_speculation=True, response_cache_size=0,
                  spec_token_budget=400)
    off, _ = _run(embedded.model, prompts, params, enable_speculation=False, response_cache_size=0)
    assert on == off
    assert st.spec_proposed > 0


def _exact_marginals(model, prompt, n_tokens):
    """Exact distribution of each of the first n_tokens sampled tokens (temperature 1)."""
    marg = [torch.zeros(model.cfg.vocab_size) for _ in range(n_tokens)]

    def walk(prefix, prob, depth):
        if depth == n_tokens:
            return
        p = torch.softmax(prompt_logits(model, prefix)[-1], -1)
        for t in range(model.cfg.vocab_size):
            marg[depth][t] += prob * p[t]
            walk(prefix + [t], prob * p[t].item(), depth + 1)
    walk(list(prompt), 1.0, 0)
    return marg


def test_sampled_speculation_keeps_the_output_distribution():
    model = small_vocab_model()
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2]  # repetitive: drafts are proposed often
    n_tok, n_samples = 4, 1500
    exact = _exact_marginals(model, prompt, n_tok)
    core = EngineCore(model, EngineConfig(kv_cache_tokens=8192, max_transient_seqs=n_samples,
                                          response_cache_size=0, spec_min_acceptance=0.0,
                                          spec_token_budget=10**6))
    params = SamplingParams(max_tokens=n_tok, temperature=1.0, ignore_eos=True)
    reqs = [core.add_request(prompt, params, lambda e: None, seq_id=core.pool.acquire("transient", 0),
                             generator=make_generator(1000 + i)) for i in range(n_samples)]
    drain(core)
    st = core.stats()
    assert st.spec_proposed > 200 and 0 < st.spec_accepted < st.spec_proposed
    for depth in range(n_tok):
        counts = Counter(r.output[depth] for r in reqs)
        expected = exact[depth] * n_samples
        chi2 = sum((counts.get(t, 0) - e.item()) ** 2 / e.item()
                   for t, e in enumerate(expected) if e.item() > 5)
        dof = sum(1 for e in expected if e.item() > 5) - 1
        # a chi-square variable exceeds dof + 5*sqrt(2*dof) + 5 with probability < 1e-4
        assert chi2 < dof + 5 * math.sqrt(2 * dof) + 5, (depth, chi2, dof)


def test_response_cache_answers_a_repeat_with_zero_model_work():
    prompt = list(range(20, 60))
    params = SamplingParams(max_tokens=12, temperature=1.0)

    async def main():
        async with Engine(tiny_model("llama"), EngineConfig(kv_cache_tokens=4096)) as eng:
            first = await eng.complete(prompt, params)
            steps = eng.stats().steps
            second = await eng.complete(prompt, params)
            assert second.token_ids == first.token_ids
            assert eng.stats().steps == steps and eng.stats().response_cache_hits == 1
            other = await eng.complete(prompt, params, cache_salt="tenant-b")
            assert eng.stats().steps > steps and eng.stats().response_cache_hits == 1
            # prompt-deterministic sampling: the other tenant computed the same output afresh
            assert other.token_ids == first.token_ids
    anyio.run(main)


def _chi2_ok(samples: list[int], probs: torch.Tensor) -> bool:
    n = len(samples)
    counts = Counter(samples)
    cells = [(counts.get(t, 0), p.item() * n) for t, p in enumerate(probs) if p.item() * n > 5]
    chi2 = sum((c - e) ** 2 / e for c, e in cells)
    dof = len(cells) - 1
    rare = sum(c for t, c in counts.items() if probs[t].item() * n <= 5)
    return chi2 < dof + 5 * math.sqrt(2 * dof) + 5 and rare <= 5 + 0.01 * n


@pytest.mark.parametrize("draft_rank", [0, 2, 5])  # a likely, a middling and an unlikely draft
def test_rejection_rule_samples_exactly_from_the_target(draft_rank):
    from agentrt.sampling.speculative import verify_sampled

    g = torch.Generator().manual_seed(draft_rank)
    logits = torch.randn(2, 10, generator=g) * 1.5
    params = SamplingParams(temperature=0.8, top_k=8)
    from agentrt.sampling import adjusted_probs

    p = adjusted_probs(logits, params)
    d = int(p[0].argsort(descending=True)[draft_rank])
    firsts, seconds = [], []
    for i in range(6000):
        out = verify_sampled(logits, [d], params, make_generator(i))
        firsts.append(out[0])
        if out[0] == d:
            seconds.append(out[1])
    assert _chi2_ok(firsts, p[0])
    if len(seconds) > 200:
        assert _chi2_ok(seconds, p[1])


def test_constrained_greedy_speculation_is_token_identical():
    """Tool-call grammar + speculation == tool-call grammar alone, on SmolLM2's vocabulary."""
    from agentrt.constrain.grammar import GrammarFactory
    from agentrt.conversation.chat_format import ChatFormat
    from tests.conftest import tiny_model_with_tokenizer

    lm = tiny_model_with_tokenizer()
    fmt = ChatFormat(lm.tokenizer)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
              "parameters": {"type": "object", "properties": {
                  "city": {"type": "string", "enum": ["Paris", "Tokyo", "Lima"]},
                  "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                  "required": ["city", "unit"]}}}]
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompts = [fmt.encode([{"role": "user", "content": f"weather in {c}, call get_weather(city={c}) {i}"}],
                          tools=tools) for i, c in enumerate(["Paris", "Tokyo", "Lima"] * 3)]
    outs = []
    for spec in (True, False):
        # (fast-forward off: it would jump over the enums, leaving nothing to draft;
        # tests/test_fast_forward.py runs the two together)
        core = EngineCore(lm.model, EngineConfig(enable_speculation=spec, response_cache_size=0,
                                                 spec_min_acceptance=0.0, grammar_fast_forward=False))
        reqs = [submit(core, p, SamplingParams(max_tokens=60),
                       constraint=factory.for_tools(tools, "required")) for p in prompts]
        drain(core)
        outs.append([r.output for r in reqs])
        if spec:
            assert core.stats().spec_proposed > 0
    assert outs[0] == outs[1]
    assert all(r.finish_reason == "stop" for r in reqs)
