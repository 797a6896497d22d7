"""The engine on the embedded SmolLM2 (shorter than the tiny-model suite): batched, chunked,
radix-cached and session outputs equal naive greedy decoding token for token."""

from __future__ import annotations

import pytest

from agentrt.config import EngineConfig
from agentrt.conversation.chat_format import ChatFormat
from agentrt.engine.core import EngineCore
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from tests.engine_util import drain, submit

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

QUESTIONS = ["What is the capital of France?", "Name a prime number.", "Say hi in Spanish.",
             "What color is the sky?", "Count to three.", "What is 2 + 2?"]


def test_concurrent_chunked_requests_match_naive(embedded):
    fmt = ChatFormat(embedded.tokenizer)
    system = {"role": "system", "content": "You are a helpful assistant. " * 8}
    prompts = [fmt.encode([system, {"role": "user", "content": q}]) for q in QUESTIONS]
    params = SamplingParams(max_tokens=12)
    core = EngineCore(embedded.model, EngineConfig(chunk_min=32, chunk_max=32, n_batch=32,
                                                   response_cache_size=0),
                      eos_token_ids=embedded.tokenizer.eos_token_ids)
    reqs = [submit(core, p, params) for p in prompts]
    drain(core)
    for r, p in zip(reqs, prompts):
        assert r.output == generate(embedded.model, p, params, embedded.tokenizer.eos_token_ids)


def test_sessions_over_turns_match_naive_and_prefill_only_deltas(embedded):
    fmt = ChatFormat(embedded.tokenizer)
    eos = embedded.tokenizer.eos_token_ids
    core = EngineCore(embedded.model, EngineConfig(response_cache_size=0), eos_token_ids=eos)
    params = SamplingParams(max_tokens=10)
    sessions = [core.open_session(core.pool.acquire("session", 0)) for _ in range(2)]
    msgs = [[{"role": "system", "content": f"You are agent {i}."}] for i in range(2)]
    tokens = [fmt.encode(m, add_generation_prompt=False) for m in msgs]
    for turn in range(3):
        for i, s in enumerate(sessions):
            new = [{"role": "user", "content": QUESTIONS[turn * 2 + i]}]
            tokens[i] = tokens[i] + fmt.encode_delta(msgs[i], new)
            msgs[i] = msgs[i] + new
            held = len(s.seq.tokens)
            r = submit(core, tokens[i], params, session=s)
            drain(core)
            assert r.output == generate(embedded.model, tokens[i], params, eos)
            if turn:
                assert r.usage().computed_prompt_tokens == len(tokens[i]) - held
            tokens[i] = tokens[i] + fmt.encode_assistant_tokens(r.output)
            msgs[i] = msgs[i] + [{"role": "assistant", "content": embedded.tokenizer.decode(r.output, skip_special=True)}]
    for s in sessions:
        core.close_session(s)
    core.check_invariants()
