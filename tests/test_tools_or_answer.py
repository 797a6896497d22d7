"""Tools and a response schema in one round (issue 33, part 2): under tool_choice auto with a
response schema, one grammar admits either the calls in the model family's format or one JSON
answer matching the schema -- and nothing else (no free text).

Oracle: a property test over outputs drawn from both sides and their near misses, on both grammar
backends and the tagged formats: the grammar accepts an output (every token, then end-of-turn)
exactly when the call parser reads it as valid calls of declared tools, or `json.loads` +
`jsonschema` accept it as the answer. Then a Conversation round on a tiny model under that grammar,
and the server's `response_format` with `tools`.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.constrain.grammar import GrammarFactory
from agentrt.toolcall import CallComplete, CallInvalid, ToolCallParser
from agentrt.toolcall.formats import FORMATS
from tests.test_grammar import PAD, TOOLS, tok  # noqa: F401  (the fixture)

ANSWER = {"type": "object", "properties": {"setup": {"type": "string"}, "rating": {"type": "integer"}},
          "required": ["setup", "rating"], "additionalProperties": False}
TAGGED = ["hermes", "qwen", "mistral", "phi4"]


@pytest.fixture(scope="module", params=[(b, f) for b in ("xgrammar", "llguidance") for f in TAGGED], ids=str)
def factory(request, tok):  # noqa: F811
    backend, fmt = request.param
    return GrammarFactory(tok, tok.vocab_size + PAD, backend=backend, tool_format=FORMATS[fmt])


def accepted(factory, tok, text: str) -> bool:  # noqa: F811
    c = factory.for_tools(TOOLS, "auto", answer_schema=ANSWER)
    ids = tok.encode(text) + [tok.eos_token_ids[0]]
    return c.accepts_prefix(ids) == len(ids)


def oracle(factory, text: str) -> bool:
    """Valid calls of the declared tools (the parser, in the factory's format), or a valid answer."""
    fmt = factory.tool_format
    parser = ToolCallParser(TOOLS, **fmt.parser_options())
    events = parser.feed(text) + parser.close()
    calls = [e for e in events if isinstance(e, CallComplete)]
    if calls and not any(isinstance(e, CallInvalid) for e in events) and \
            text == fmt.render_calls([(c.name, _ordered(c.name, c.arguments)) for c in calls]):
        return True
    try:
        obj = json.loads(text)
        jsonschema.validate(obj, ANSWER)
    except (ValueError, jsonschema.ValidationError):
        return False
    # (the grammar's fixed JSON style: json.dumps' separators, properties in the schema's order)
    return text == json.dumps({k: obj[k] for k in ANSWER["properties"] if k in obj})


def _ordered(name: str, args: dict) -> dict:
    """Arguments in their tool schema's property order (the grammar writes them so)."""
    props = next(t["function"]["parameters"]["properties"] for t in TOOLS if t["function"]["name"] == name)
    return {k: args[k] for k in props if k in args}


# (objects with their keys in the schema's order: the grammar writes properties in that order).
# Strings leave out U+007F: JSON allows it raw, and the formats write it raw (ensure_ascii off),
# but llguidance's JSON lexer refuses it as a control character (xgrammar accepts it)
_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x7f"), max_size=8)
answers = st.builds(lambda s, r: {"setup": s, "rating": r}, _text, st.integers(-99, 99))
near_answers = st.one_of(st.builds(lambda s: {"setup": s}, _text),
                         st.builds(lambda s, r: {"setup": s, "rating": r}, st.integers(), st.integers()),
                         st.builds(lambda s, r, e: {"setup": s, "rating": r, "extra": e},
                                   _text, st.integers(0, 9), st.booleans()),
                         st.builds(lambda s, r: {"rating": r, "setup": s}, _text, st.integers(0, 9)))
weather = st.one_of(st.builds(lambda c: {"city": c}, _text),
                    st.builds(lambda c, u: {"city": c, "unit": u}, _text,
                              st.sampled_from(["celsius", "kelvin"])),
                    st.builds(lambda c: {"unit": "celsius", "city": c}, _text))


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_the_grammar_accepts_exactly_calls_or_a_valid_answer(factory, tok, data):  # noqa: F811
    fmt = factory.tool_format
    kind = data.draw(st.sampled_from(["answer", "near_answer", "call", "calls", "text", "both"]))
    if kind == "answer":
        text = json.dumps(data.draw(answers))
    elif kind == "near_answer":
        text = json.dumps(data.draw(near_answers))
    elif kind in ("call", "calls"):
        n = 1 if kind == "call" else 2
        text = fmt.render_calls([("get_weather", data.draw(weather)) for _ in range(n)])
    elif kind == "text":
        text = data.draw(st.sampled_from(["Sure.", "", "The answer is 4."]))
    else:  # an answer followed by a call, or text before a call: neither side alone
        text = json.dumps(data.draw(answers)) + fmt.render_calls([("get_time", {"timezone": "UTC"})])
    assert accepted(factory, tok, text) == oracle(factory, text), text


def test_required_and_named_choices_ignore_the_answer(factory, tok):  # noqa: F811
    answer = json.dumps({"setup": "x", "rating": 1})
    for choice in ("required", "get_weather"):
        c = factory.for_tools(TOOLS, choice, answer_schema=ANSWER)
        ids = tok.encode(answer) + [tok.eos_token_ids[0]]
        assert c.accepts_prefix(ids) < len(ids)


def test_a_round_with_tools_and_a_schema_gives_calls_or_an_answer(tmp_path_factory):
    """A Conversation round with tools and a response schema: the request's grammar (checked at
    submission) takes a call and takes an answer -- neither side is dropped -- and the tiny model's
    replies under it are valid calls or a valid answer. A bare-JSON format keeps the schema only."""
    import anyio

    from agentrt import Engine, EngineConfig
    from agentrt.conversation.conversation import Conversation
    from agentrt.sampling import SamplingParams
    from tests.test_formats_agent import _model

    # (finite languages on both sides: a random model loops inside free strings until max_tokens)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]
    answer = {"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]}}, "required": ["mood"]}

    async def main(name):
        lm = _model(name, str(tmp_path_factory.getbasetemp() / "qwen"))
        seen, ends = [], []
        async with Engine(lm, EngineConfig(kv_cache_tokens=8192, response_cache_size=0)) as eng:
            real = eng.generate

            def generate(prompt, params, **kw):  # what the submitted grammar takes
                tok, fmt = eng.tokenizer, Conversation(eng).chat.tool_format
                eos = [tok.eos_token_ids[0]]
                for text in (fmt.render_calls([("get_weather", {"city": "Rome"})]), json.dumps({"mood": "sad"})):
                    ids = tok.encode(text, special=True) + eos
                    seen.append(kw["constraint"].accepts_prefix(ids) == len(ids))
                return real(prompt, params, **kw)

            eng.generate = generate
            for i in range(4):
                conv = Conversation(eng, tools=tools)
                conv.append([{"role": "user", "content": f"Question {i}: " + "weather? " * i}])
                async for ev in conv.round(SamplingParams(max_tokens=60), json_schema=answer):
                    end = ev
                ends.append(end)
        return seen, ends

    seen, ends = anyio.run(main, "hermes")
    assert all(seen) and len(seen) == 8
    for end in ends:  # (a started repeat of a call ends the round: CallLimits)
        if end.calls:
            assert end.text.strip() == "" and all(c.name == "get_weather" for c in end.calls)
        else:
            jsonschema.validate(json.loads(end.text), answer)
    seen, _ = anyio.run(main, "llama3")  # bare JSON calls: the schema only, as before
    assert seen == [False, True] * 4
