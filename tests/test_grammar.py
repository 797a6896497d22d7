"""Constrained decoding (agentrt.constrain.grammar): masks, tool_choice, caching, rollback, errors.

Unit tests use a small synthetic byte-level tokenizer (both backends); the embedded tests let
SmolLM2-135M generate under each tool_choice and check the outputs with ToolCallParser,
json.loads and jsonschema.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import tokenizers
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from agentrt.constrain.grammar import GrammarFactory
from agentrt.conversation.chat_format import ChatFormat
from agentrt.errors import ConfigError, GrammarError, SchemaUnsupported
from agentrt.model.generate import generate
from agentrt.model.tokenizer import Tokenizer, byte_to_unicode
from agentrt.sampling import SamplingParams
from agentrt.toolcall import CallComplete, CallInvalid, ToolCallParser

BACKENDS = ["xgrammar", "llguidance"]
PAD = 40  # model rows beyond the tokenizer's vocabulary (not a multiple of 32)


def _tool(name: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool", "parameters": {
        "type": "object", "properties": props, "required": required}}}


WEATHER = _tool("get_weather", {"city": {"type": "string"},
                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])
TIME = _tool("get_time", {"timezone": {"type": "string"}}, ["timezone"])
BOOK = _tool("book", {"guests": {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}},
    "nights": {"type": "integer"}}, ["guests", "nights"])
TOOLS = [WEATHER, TIME, BOOK]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"]}


def call(name: str, args: dict) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """Byte-level BPE: 256 byte tokens, a few merges crossing JSON boundaries, 3 special tokens."""
    vocab = {ch: i for i, ch in enumerate(byte_to_unicode())}
    merges = [("{", '"'), ('"', ":"), ("Ġ", '"'), ('"', ","), ("}", "<"), ("<", "t")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    return Tokenizer(backend, eos_token_ids=[backend.token_to_id("<|im_end|>"), backend.token_to_id("<|endoftext|>")])


@pytest.fixture(scope="module", params=BACKENDS)
def factory(request, tok) -> GrammarFactory:
    return GrammarFactory(tok, tok.vocab_size + PAD, backend=request.param)


def ids_of(tok: Tokenizer, text: str, eos: bool = True) -> list[int]:
    return tok.encode(text) + ([tok.eos_token_ids[0]] if eos else [])


VALID = [  # (tool_choice, parallel, text)
    ("required", True, call("get_weather", {"city": "Paris", "unit": "celsius"})),
    ("required", True, call("get_time", {"timezone": "UTC"}) + "\n" + call("book", {
        "guests": [{"name": "Ann", "age": 3}, {"name": "Bo"}], "nights": 2})),
    ("required", False, call("book", {"guests": [], "nights": -1})),
    ("get_time", True, call("get_time", {"timezone": "Europe/Paris \"quoted\" \u00e9"})),
    ({"type": "function", "function": {"name": "get_weather"}}, True, call("get_weather", {"city": "Rome"})),
    ("auto", True, "No tool needed: 2 + 2 = 4. <tool_cal is not a tag."),
    ("auto", True, "Let me check. " + call("get_weather", {"city": "Oslo"})),
    ("auto", True, ""),
]


@pytest.mark.parametrize("choice,parallel,text", VALID)
def test_valid_outputs_are_allowed_token_by_token(factory, tok, choice, parallel, text):
    c = factory.for_tools(TOOLS, choice, parallel_tool_calls=parallel)
    for t in ids_of(tok, text):
        assert not c.is_terminated()
        allowed = c.allowed()
        assert allowed.shape == (tok.vocab_size + PAD,) and allowed[t]
        assert not allowed[tok.vocab_size:].any()  # padding rows never
        assert not allowed[tok.special_tokens["<|im_start|>"]]
        c.advance(t)
    assert c.is_terminated() and c.error is None


INVALID = [  # (tool_choice, parallel, text): each is rejected before its end
    ("required", True, "Sure! " + call("get_time", {"timezone": "UTC"})),  # text before a required call
    ("required", True, call("get_wether", {"city": "Paris"})),  # unknown tool
    ("required", True, call("get_weather", {"city": 3})),  # wrong type
    ("required", True, call("get_weather", {"city": "Paris", "unit": "kelvin"})),  # not in the enum
    ("required", True, call("get_weather", {"unit": "celsius"})),  # missing required property
    ("required", True, call("book", {"guests": [{"age": 3}], "nights": 1})),  # nested required
    ("required", True, call("get_time", {"timezone": "UTC", "extra": 1})),  # unknown property
    ("required", True, '<tool_call>{"name":"get_time", "arguments": {"timezone": "UTC"}}</tool_call>'),  # spacing
    ("required", False, call("get_time", {"timezone": "UTC"}) + "\n" + call("get_time", {"timezone": "UTC"})),
    ("get_time", True, call("get_weather", {"city": "Paris"})),  # another tool than the named one
    ("auto", True, "Text " + call("get_time", {"timezone": "UTC"}) + " and more text"),
    ("auto", True, "Text <tool_call>not json</tool_call>"),
]


@pytest.mark.parametrize("choice,parallel,text", INVALID)
def test_invalid_outputs_are_rejected(factory, tok, choice, parallel, text):
    if '"extra"' in text and factory.backend.name == "llguidance":
        pytest.skip("llguidance allows undeclared properties unless additionalProperties is false")
    c = factory.for_tools(TOOLS, choice, parallel_tool_calls=parallel)
    ids = ids_of(tok, text)
    n = c.accepts_prefix(ids)
    assert n < len(ids)
    assert c.num_accepted == 0 and c.accepts_prefix(ids) == n  # no state change
    for t in ids[:n]:
        c.advance(t)
    assert not c.allowed()[ids[n]]
    c.advance(ids[n])  # forcing the rejected token: the request ends, flagged
    assert c.is_terminated() and "not allowed" in c.error


def test_eos_only_after_a_complete_call(factory, tok):
    c = factory.for_tools(TOOLS, "required", parallel_tool_calls=False)
    ids = tok.encode(call("get_time", {"timezone": "UTC"}))
    for t in ids[:-1]:
        assert not c.allowed()[list(tok.eos_token_ids)].any()
        c.advance(t)
    c.advance(ids[-1])
    assert c.allowed().nonzero().flatten().tolist() == sorted(tok.eos_token_ids)


@pytest.mark.parametrize("choice", ["required", "auto", "get_weather", "json"])
def test_mask_is_never_empty_on_random_walks(factory, tok, choice):
    rng = random.Random(7)
    for _ in range(6):
        c = factory.for_json_schema(PERSON) if choice == "json" else factory.for_tools(TOOLS, choice)
        for _ in range(60):
            allowed = c.allowed().nonzero().flatten().tolist()
            assert allowed and max(allowed) < tok.vocab_size
            c.advance(rng.choice(allowed))
            assert c.error is None
            if c.is_terminated():
                break


def test_mask_logits_sets_forbidden_tokens_to_minus_inf(factory, tok):
    c = factory.for_tools(TOOLS, "required")
    width = tok.vocab_size + PAD
    with torch.inference_mode():  # the model's logits are inference tensors
        logits = torch.randn(width)
    expect = torch.where(c.allowed(), logits, torch.tensor(float("-inf")))
    out = c.mask_logits(logits)
    assert out is logits and torch.equal(out, expect) and torch.isinf(out).sum() > width - 10


def test_json_schema_output(factory, tok):
    text = json.dumps({"name": "Ann", "age": 30, "tags": ["a", "b"]})
    c = factory.for_json_schema(PERSON)
    assert c.accepts_prefix(ids_of(tok, text)) == len(ids_of(tok, text))
    bad = json.dumps({"name": "Ann"})
    assert c.accepts_prefix(ids_of(tok, bad)) < len(ids_of(tok, bad))


def test_rollback_and_accepts_prefix(factory, tok):
    c = factory.for_tools(TOOLS, "get_time")
    ids = ids_of(tok, call("get_time", {"timezone": "UTC"}))
    assert c.accepts_prefix(ids) == len(ids) and c.num_accepted == 0
    for t in ids:
        c.advance(t)
    assert c.is_terminated()
    c.rollback(1)  # the end-of-turn token can be taken back
    assert not c.is_terminated() and c.accepts_prefix(ids[-1:]) == 1
    c.rollback(len(ids) - 1)
    assert c.num_accepted == 0 and c.accepts_prefix(ids) == len(ids)
    with pytest.raises(ConfigError):
        c.rollback(1)
    c.advance(ids[0])
    c.advance(tok.encode("x")[0])  # a rejected draft token: flagged, state intact
    assert c.error and c.is_terminated()
    c.rollback(1)
    assert c.error is None and c.accepts_prefix(ids) == len(ids)


def test_no_constraint_for_none_or_no_tools(factory):
    before = factory.compiles
    assert factory.for_tools(TOOLS, "none") is None
    assert factory.for_tools(None, "auto") is None and factory.for_tools([], None) is None
    assert factory.compiles == before


def test_grammars_are_compiled_once_per_tools_and_choice(tok):
    f = GrammarFactory(tok, backend="xgrammar")
    a, b = f.for_tools(TOOLS, "required"), f.for_tools(json.loads(json.dumps(TOOLS)), "required")
    assert f.compiles == 1 and a is not b  # one matcher per request, one compiled grammar
    f.for_tools(TOOLS, "auto")
    f.for_tools(TOOLS, {"type": "function", "function": {"name": "get_time"}})
    f.for_tools(TOOLS, "get_time")
    f.for_json_schema(PERSON)
    f.for_json_schema(dict(PERSON))
    assert f.compiles == 4  # the two spellings of a named tool_choice share one grammar


@pytest.mark.parametrize("tools,choice", [
    (TOOLS, "get_temperature"), (TOOLS, {"type": "function", "function": {"name": "nope"}}), (TOOLS, 3),
    (TOOLS, {"type": "function"}), (None, "required"), ([], "get_time"), ([{"name": 3}], "auto"),
])
def test_bad_tool_choice_or_tools_is_a_config_error(factory, tools, choice):
    with pytest.raises(ConfigError):
        factory.for_tools(tools, choice)


def test_bad_arguments(factory, tok):
    with pytest.raises(ConfigError):
        factory.for_json_schema("not a schema")
    with pytest.raises(ConfigError):
        factory.for_json_schema({"type": 12})  # not a valid JSON schema
    with pytest.raises(ConfigError):
        factory.for_tools(TOOLS, "auto", parallel_tool_calls="yes")
    with pytest.raises(ConfigError):
        GrammarFactory(tok, tok.vocab_size - 1)
    with pytest.raises(ConfigError):
        GrammarFactory(tok, backend="outlines")


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
    ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}, "$ref"),
    ({"type": "string", "pattern": "(?<=a)b"}, "pattern"),
])
def test_schemas_the_backend_cannot_handle_name_the_tool_and_the_feature(factory, schema, keyword):
    """A typed SchemaUnsupported (a GrammarError): the tool whose parameters fail, and the keyword
    at fault with its JSON pointer, so a client with many tools knows what to fix."""
    with pytest.raises(SchemaUnsupported, match="cannot compile the response schema") as info:
        factory.for_json_schema(schema)
    assert info.value.tool is None and info.value.feature.startswith(keyword), info.value
    tools = {"fine": {"type": "object", "properties": {"q": {"type": "string"}}},
             "bad_tool": {"type": "object", "properties": {"p": schema}, "required": ["p"]}}
    with pytest.raises(SchemaUnsupported, match="cannot compile the parameters of tool 'bad_tool'") as info:
        factory.for_tools(tools, "required")
    # llguidance reports an unsatisfiable property as its `required` entry: that keyword is named then
    feat = info.value.feature
    assert info.value.tool == "bad_tool" and (feat.startswith(f"{keyword} at /properties/p/")
                                              or feat == "required at /required"), info.value
    assert isinstance(info.value, GrammarError)


def test_non_byte_level_tokenizer_is_refused():
    vocab = {"<unk>": 0, "a": 1, "b": 2}
    backend = tokenizers.Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    with pytest.raises(GrammarError, match="byte-level"):
        GrammarFactory(Tokenizer(backend, eos_token_ids=[0]))


# -- the embedded SmolLM2 --------------------------------------------------------------------------

WEATHER_Q = "What's the weather like in Paris today?"


@pytest.fixture(scope="module")
def smol(embedded):
    return embedded, ChatFormat(embedded.tokenizer), GrammarFactory(embedded.tokenizer, embedded.config.vocab_size)


def run(smol, question: str, constraint, max_tokens: int = 48, tools=TOOLS[:2]) -> tuple[list[int], str]:
    lm, chat, _ = smol
    prompt = chat.encode([{"role": "user", "content": question}], tools=tools, add_generation_prompt=True)
    out = generate(lm.model, prompt, SamplingParams(max_tokens=max_tokens), lm.tokenizer.eos_token_ids,
                   constraint=constraint)
    return out, lm.tokenizer.decode(out, skip_special=True)


def parsed_calls(text: str, tools=TOOLS[:2]) -> list[CallComplete]:
    parser = ToolCallParser(tools, wrapper="hermes")
    events = parser.feed(text) + parser.close()
    assert not [e for e in events if isinstance(e, CallInvalid)], events
    calls = [e for e in events if isinstance(e, CallComplete)]
    for c in calls:  # name in the set, arguments pass the tool's schema
        jsonschema.validate(c.arguments, SCHEMAS[c.name])
    return calls


@pytest.mark.embedded
@pytest.mark.slow
@pytest.mark.parametrize("question", [WEATHER_Q, "Hi! How are you?", "What time is it in Tokyo?"])
def test_embedded_required_gives_valid_calls(smol, question):
    _, _, factory = smol
    out, text = run(smol, question, factory.for_tools(TOOLS[:2], "required", parallel_tool_calls=False))
    assert out[-1] in smol[0].tokenizer.eos_token_ids  # the grammar ended the turn
    assert len(parsed_calls(text)) == 1
    if question == WEATHER_Q:  # what the model does unconstrained (prose, usually): shown by -rP only
        print("unconstrained:", repr(run(smol, question, None, max_tokens=16)[1]))


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_named_tool_choice_forces_that_tool(smol):
    _, _, factory = smol
    _, text = run(smol, WEATHER_Q, factory.for_tools(TOOLS[:2], {"type": "function", "function": {"name": "get_time"}}))
    assert [c.name for c in parsed_calls(text)] == ["get_time"]


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_auto_allows_plain_text(smol):
    _, _, factory = smol
    free, _ = run(smol, "Hi! How are you?", None, max_tokens=24)
    out, text = run(smol, "Hi! How are you?", factory.for_tools(TOOLS[:2], "auto"), max_tokens=24)
    assert "<tool_call>" not in text and text.strip()
    assert out == free  # the grammar did not change the model's free text


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_json_schema_output(smol):
    _, _, factory = smol
    schema = {"type": "object", "properties": {
        "city": {"type": "string"}, "temperature_c": {"type": "number"},
        "conditions": {"type": "string", "enum": ["sunny", "cloudy", "rainy"]}},
        "required": ["city", "temperature_c", "conditions"]}
    _, text = run(smol, "Describe the weather in Paris as JSON.", factory.for_json_schema(schema), tools=None)
    jsonschema.validate(json.loads(text), schema)
