"""Grammar fast-forward (constrain/forcing.py, constrain/fast_forward.py).

Oracles: the forced ids are the tokenizer's encoding of the forced text (healed, held back,
ended as forcing.py says); the engine's output with fast-forward (forced ids fed in one chunk,
in batches, with speculation, from the start of the output) is token-identical to the naive
reference that feeds the same ids one step at a time (`generate(fast_forward=True)`); with it off,
to plain constrained greedy decoding."""

from __future__ import annotations

import json

import pytest

from agentrt.config import EngineConfig
from agentrt.constrain.grammar import GrammarFactory
from agentrt.conversation.chat_format import ChatFormat
from agentrt.engine.core import EngineCore
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from agentrt.scheduling.preemption import preempt
from agentrt.toolcall.formats import FORMATS
from tests.conftest import tiny_model_with_tokenizer
from tests.engine_util import drain, submit

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [WEATHER, TIME]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'


def _spell(tok, ids):
    return [tok.token_bytes(i) for i in ids]


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
def test_forced_text_is_spelled_canonically_with_healing_hold_back_and_end(backend):
    lm = tiny_model_with_tokenizer()
    tok = lm.tokenizer
    c = GrammarFactory(tok, lm.model.cfg.vocab_size, backend=backend).for_tools(
        TOOLS, "required", parallel_tool_calls=False)
    replaced, out = c.fast_forward(None, 100)
    # the start: the tag and the name's shared head, as the tokenizer spells them
    assert replaced == 0 and out == tok.encode('<tool_call>{"name": "get_')
    while not c.is_terminated():
        done = tok.decode(out)
        rest = CALL[len(done):]
        # the model writes the tokenizer's first token of what is left, but one letter of "celsius"
        t = tok.encode(rest)[0] if rest else tok.eos_token_ids[0]
        t = tok.encode("c")[0] if rest.startswith("celsius") else t
        c.advance(t)
        replaced, ids = c.fast_forward(t, 100)
        out = out + [t] if not replaced else out
        out += ids
        if rest.startswith('weather"'):
            # ... then '", "arguments": {"city": "' is forced, less its last ' "': the model's
            # next text could merge with it (' "P...'), so that token is the model's to choose
            assert tok.decode(ids) == '", "arguments": {"city":'
    assert out == tok.encode(CALL) + [tok.eos_token_ids[0]]  # the end-of-turn was forced too
    assert c.num_accepted == len(out)


def test_healing_respells_the_models_token_with_the_forced_text():
    lm = tiny_model_with_tokenizer()
    tok = lm.tokenizer
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
        "required": ["city"]}}}]
    c = GrammarFactory(tok, lm.model.cfg.vocab_size).for_tools(tools, "pick")
    _, head = c.fast_forward(None, 100)
    # no token extends ' "' with a letter in this vocabulary: the quote is not held back
    assert tok.decode(head).endswith('{"city": "')
    p = tok.encode("P")[0]  # the model picks "P": "aris" is forced after it
    c.advance(p)
    replaced, ids = c.fast_forward(p, 100)
    assert replaced == 1  # "P" + 'aris"}}</tool_call>' is spelled "Paris", ...
    assert ids == tok.encode('Paris"}}</tool_call>') + [tok.eos_token_ids[0]]
    assert ids[0] != p
    assert c.is_terminated() and c.num_accepted == len(head) + len(ids)
    c.rollback(len(ids))  # the state is exactly the accepted ids'
    assert c.accepts_prefix(ids) == len(ids)


def test_room_caps_the_forced_ids():
    lm = tiny_model_with_tokenizer()
    c = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size).for_tools(TOOLS, "get_weather")
    _, ids = c.fast_forward(None, 3)
    assert len(ids) == 3 and c.num_accepted == 3


def _prompts(fmt, n):
    cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Perth", "Seoul"]
    asks = ["What is the weather in {} in celsius?", "What time is it in {}?"]
    return [fmt.encode([{"role": "user", "content": asks[i % 2].format(cities[i % 8])}], tools=TOOLS)
            for i in range(n)]


def _engine(model, factory, prompts, choice, params, **cfg):
    core = EngineCore(model, EngineConfig(response_cache_size=0, spec_min_acceptance=0.0,
                                          debug_invariants=True, **cfg))
    reqs = [submit(core, p, params, constraint=factory.for_tools(TOOLS, choice)) for p in prompts]
    steps = drain(core)
    return [r.output for r in reqs], steps, core.stats()


@pytest.mark.parametrize("fmt_name", ["hermes", "qwen", "llama3", "mistral"])
@pytest.mark.parametrize("batch", [1, 8])
def test_engine_matches_the_one_token_per_step_reference(fmt_name, batch):
    lm = tiny_model_with_tokenizer()
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size, tool_format=FORMATS[fmt_name])
    prompts = _prompts(ChatFormat(lm.tokenizer), batch)
    params = SamplingParams(max_tokens=64)
    eos = lm.tokenizer.eos_token_ids
    for choice in ("required", "get_time"):
        ref = [generate(lm.model, p, params, eos, constraint=factory.for_tools(TOOLS, choice), fast_forward=True)
               for p in prompts]
        plain = [generate(lm.model, p, params, eos, constraint=factory.for_tools(TOOLS, choice)) for p in prompts]
        for spec in (True, False):
            on, steps_on, st = _engine(lm.model, factory, prompts, choice, params, enable_speculation=spec)
            off, steps_off, _ = _engine(lm.model, factory, prompts, choice, params, enable_speculation=spec,
                                        grammar_fast_forward=False)
            assert on == ref
            assert off == plain
            assert st.ff_tokens > 0 and steps_on < steps_off


def test_drafts_continue_after_forced_text():
    """Speculation on a request whose forced ids ride the same step: the draft follows them."""
    lm = tiny_model_with_tokenizer()
    tok = lm.tokenizer
    factory = GrammarFactory(tok, lm.model.cfg.vocab_size)
    # a long free string the prompt already holds: drafts from its n-grams
    prompts = [ChatFormat(tok).encode([{"role": "user", "content": "city: " + "Paris Tokyo Lima " * 6}], tools=TOOLS)]
    params = SamplingParams(max_tokens=60)
    eos = tok.eos_token_ids
    ref = [generate(lm.model, p, params, eos, constraint=factory.for_tools(TOOLS, "get_time"), fast_forward=True)
           for p in prompts]
    on, _, st = _engine(lm.model, factory, prompts, "get_time", params, enable_speculation=True,
                        spec_token_budget=64)
    assert on == ref
    assert st.spec_proposed > 0 and st.ff_tokens > 0


def test_a_fully_forced_output_ends_without_model_work():
    lm = tiny_model_with_tokenizer()
    tok = lm.tokenizer
    factory = GrammarFactory(tok, lm.model.cfg.vocab_size)
    schema = {"type": "object", "properties": {"ok": {"const": True}}, "required": ["ok"],
              "additionalProperties": False}
    core = EngineCore(lm.model, EngineConfig(response_cache_size=0, debug_invariants=True))
    r = submit(core, tok.encode("answer"), SamplingParams(max_tokens=20), constraint=factory.for_json_schema(schema))
    assert r.finish_reason == "stop" and not core.has_work()
    assert json.loads(tok.decode(r.output[:-1])) == {"ok": True}
    assert drain(core) == 0 and core.stats().steps == 0


def test_max_tokens_inside_forced_text_ends_with_length():
    lm = tiny_model_with_tokenizer()
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompts = _prompts(ChatFormat(lm.tokenizer), 2)
    for n in (1, 5, 12):
        out, _, _ = _engine(lm.model, factory, prompts, "get_weather", SamplingParams(max_tokens=n))
        ref = [generate(lm.model, p, SamplingParams(max_tokens=n), lm.tokenizer.eos_token_ids,
                        constraint=factory.for_tools(TOOLS, "get_weather"), fast_forward=True) for p in prompts]
        assert out == ref and all(len(o) == n for o in out)


def test_sampled_requests_fast_forward_too():
    lm = tiny_model_with_tokenizer()
    tok = lm.tokenizer
    factory = GrammarFactory(tok, lm.model.cfg.vocab_size)
    enums = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
        "v": {"type": "string", "enum": values}}, "required": ["v"]}}}
        for name, values in (("pick_city", ["Paris", "Tokyo"]), ("pick_unit", ["celsius", "kelvin"]))]
    core = EngineCore(lm.model, EngineConfig(response_cache_size=0, debug_invariants=True))
    reqs = [submit(core, p, SamplingParams(max_tokens=100, temperature=0.8, seed=i),
                   constraint=factory.for_tools(enums, "required", parallel_tool_calls=False))
            for i, p in enumerate(_prompts(ChatFormat(tok), 6))]
    drain(core)
    assert core.stats().ff_tokens > 0
    for r in reqs:
        assert r.output[-1] in tok.eos_token_ids and r.finish_reason == "stop"
        text = tok.decode(r.output[:-1])
        call = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert call["name"] in ("pick_city", "pick_unit") and call["arguments"]["v"]


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_model_fast_forward_matches_reference_in_a_batch_of_8(embedded):
    """SmolLM2-135M, hermes and mistral formats, a batch of 8 with and without speculation."""
    tok = embedded.tokenizer
    prompts = _prompts(ChatFormat(tok), 8)
    params = SamplingParams(max_tokens=48)
    for name in ("hermes", "mistral"):
        factory = GrammarFactory(tok, embedded.model.cfg.vocab_size, tool_format=FORMATS[name])
        ref = [generate(embedded.model, p, params, tok.eos_token_ids,
                        constraint=factory.for_tools(TOOLS, "required"), fast_forward=True) for p in prompts]
        for spec in (True, False):
            out, _, st = _engine(embedded.model, factory, prompts, "required", params, enable_speculation=spec)
            assert out == ref
            assert st.ff_tokens > 0


def test_extensions_are_exactly_the_longer_tokens_with_that_prefix():
    """ForcedText.extensions (a bisect over the sorted vocabulary) against a scan of it."""
    import random

    from agentrt.constrain.forcing import ForcedText

    tok = tiny_model_with_tokenizer().tokenizer
    ft = ForcedText(tok, frozenset())
    vocab = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    special = set(tok.special_tokens.values())
    picks = random.Random(0).sample(range(tok.vocab_size), 200) + tok.encode(' " { ":') + sorted(special)[:3]
    for t in picks:
        b = vocab[t]
        want = [] if t in special else [i for i, v in enumerate(vocab) if len(v) > len(b) and v.startswith(b)]
        assert sorted(ft.extensions(t).tolist()) == want, (t, b)


def test_masks_filled_beside_the_forward_change_nothing():
    """grammar_overlap: the step's masks are filled in a worker during the forward; the outputs
    equal those with every mask filled on the step thread, and the worker's time is counted."""
    lm = tiny_model_with_tokenizer()
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompts = _prompts(ChatFormat(lm.tokenizer), 8)
    params = SamplingParams(max_tokens=40)
    on, _, st_on = _engine(lm.model, factory, prompts, "required", params, grammar_overlap=True)
    off, _, st_off = _engine(lm.model, factory, prompts, "required", params, grammar_overlap=False)
    assert on == off
    assert st_on.grammar_prepare_s > 0 and st_off.grammar_prepare_s == 0


def test_a_mask_that_fails_in_the_worker_fails_its_request_alone():
    lm = tiny_model_with_tokenizer()
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompts = _prompts(ChatFormat(lm.tokenizer), 3)
    core = EngineCore(lm.model, EngineConfig(response_cache_size=0, debug_invariants=True))
    cons = [factory.for_tools(TOOLS, "required") for _ in prompts]

    def broken():
        raise RuntimeError("grammar state lost")
    reqs = [submit(core, p, SamplingParams(max_tokens=40), constraint=c) for p, c in zip(prompts, cons)]
    cons[1]._m.fill = lambda bitmask: broken()  # (after the start's fast-forward)
    drain(core)
    assert reqs[1].finish_reason == "error"
    assert reqs[0].finish_reason in ("stop", "length") and reqs[2].finish_reason in ("stop", "length")
    assert core.stats().grammar_prepare_s > 0


@pytest.mark.embedded
def test_a_session_keeps_the_canonical_call_and_respells_only_without_fast_forward(embedded):
    """A required call on SmolLM2-135M through a Conversation and its session: with fast-forward
    the reply's ids are the tokenizer's encoding of its text and nothing is respelled; without
    it greedy spells `<tool_call>` in odd pieces and the round's fallback respells the reply."""
    import anyio

    from agentrt import Engine
    from agentrt.conversation.conversation import Conversation

    async def one(ff: bool):
        cfg = EngineConfig(kv_cache_tokens=4096, response_cache_size=0, grammar_fast_forward=ff)
        async with Engine(embedded, cfg) as eng:
            session = await eng.open_session()
            conv = Conversation(eng, tools=TOOLS, session=session)
            conv.append([{"role": "user", "content": "What is the weather in Paris in celsius?"}])
            [end] = [ev async for ev in conv.round(SamplingParams(max_tokens=64), tool_choice="required",
                                                   parallel_tool_calls=False) if hasattr(ev, "message")]
            await session.close()
            return end, conv

    tok = embedded.tokenizer
    end, conv = anyio.run(one, True)
    assert [(c.name, c.arguments) for c in end.calls] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    body = end.generated[:-1]  # (less the end-of-turn)
    assert body == conv.chat.tokenize_text(tok.decode(body)) and conv.respelled == 0
    end_off, conv_off = anyio.run(one, False)
    assert tok.decode(end_off.generated) == tok.decode(end.generated)  # the same call either way
    assert end_off.generated != end.generated and conv_off.respelled == 1
    assert conv_off.tokens == conv.tokens  # respelled: the history is the same ids


def test_a_request_preempted_with_forced_ids_pending_recomputes_them():
    """Preempted between the step that fast-forwarded and the one that feeds the ids: its KV is
    dropped, the forced ids are recomputed with the rest as a prefill, the output is unchanged."""
    lm = tiny_model_with_tokenizer()
    factory = GrammarFactory(lm.tokenizer, lm.model.cfg.vocab_size)
    prompts = _prompts(ChatFormat(lm.tokenizer), 8)
    params = SamplingParams(max_tokens=64)
    ref = [generate(lm.model, p, params, lm.tokenizer.eos_token_ids, constraint=factory.for_tools(TOOLS, "required"),
                    fast_forward=True) for p in prompts]
    core = EngineCore(lm.model, EngineConfig(response_cache_size=0, debug_invariants=True, enable_radix_cache=False))
    reqs = [submit(core, p, params, constraint=factory.for_tools(TOOLS, "required")) for p in prompts]
    preempted = 0
    for _ in range(40):
        core.step()
        pending = [r for r in core.running if r.forced > 0]
        if pending:
            preempt(core.mem, core.scheduler.queues, pending[0])
            preempted += 1
    drain(core)
    assert preempted > 0 and core.stats().preemptions >= preempted
    assert [r.output for r in reqs] == ref
