"""A reply held to a JSON schema is told the schema first (agentrt/conversation/schema_hint.py):
the hint's text, where it goes in the prompt (a message of its own before the generation prompt,
rendered by the model's template: system, or user where the template refuses a system message
there), that it is for that round only (the next prompt and the conversation's tokens do not hold
it), and that JSON mode (no schema) gets none. Its effect on the embedded model is in the
LangChain standard suite (test_structured_output[pydantic] passes with it)."""

from __future__ import annotations

import anyio
import pytest
from pydantic import BaseModel, Field

from agentrt import Engine, EngineConfig
from agentrt.conversation.conversation import Conversation
from agentrt.conversation.schema_hint import schema_hint
from agentrt.sampling import SamplingParams
from tests.test_formats_agent import _model


class Joke(BaseModel):
    """Joke to tell user."""

    setup: str = Field(description="question to set up a joke")
    punchline: str = Field(description="answer to resolve the joke")
    rating: int | None = Field(default=None, description="How funny the joke is,\n from 1 to 10")


def test_the_hint_lists_fields_in_order_with_types_and_descriptions():
    text = schema_hint(Joke.model_json_schema())
    lines = text.splitlines()
    assert lines[0].startswith("Reply with only a JSON object") and "(Joke)" in lines[0]
    assert lines[1:] == ['- "setup" (string): question to set up a joke',
                         '- "punchline" (string): answer to resolve the joke',
                         '- "rating" (integer or null, optional): How funny the joke is, from 1 to 10']


def test_refs_enums_arrays_and_json_mode():
    schema = {"type": "object", "required": ["pet", "tags"], "$defs": {"Pet": {
        "type": "object", "properties": {"name": {"type": "string"}}, "description": "a pet"}},
        "properties": {"pet": {"$ref": "#/$defs/Pet"}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                       "mode": {"const": "x"}}}
    assert schema_hint(schema).splitlines()[1:] == [
        '- "pet" (object with "name"): a pet', '- "tags" (array of one of "a", "b")', '- "mode" (exactly "x", optional)']
    assert schema_hint({"type": "array", "items": {"type": "integer"}}).endswith('{"type":"array","items":{"type":"integer"}}')
    for mode in ({}, {"type": "object"}, True, {"type": "object", "additionalProperties": True}):
        assert schema_hint(mode) is None


class _Recorder:
    """The engine, with every prompt it is given recorded."""

    def __init__(self, engine):
        self.engine, self.prompts = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prompt, *args, **kwargs):
        self.prompts.append(list(prompt))
        return self.engine.generate(prompt, *args, **kwargs)


async def _two_rounds(lm, schema):
    async with Engine(lm, EngineConfig(kv_cache_tokens=4096, response_cache_size=0, debug_invariants=True)) as eng:
        rec = _Recorder(eng)
        session = await eng.open_session()
        conv = Conversation(rec, session=session)
        conv.append([{"role": "system", "content": "You tell jokes."}, {"role": "user", "content": "A cat joke."}])
        before = list(conv.tokens)
        async for _ in conv.round(SamplingParams(max_tokens=24), json_schema=schema):
            pass
        conv.append([{"role": "user", "content": "Another."}])
        after = list(conv.tokens)
        async for _ in conv.round(SamplingParams(max_tokens=8)):
            pass
        await session.close()
        st = eng.stats()  # (the first round's constrained steps: each masked row timed)
        assert st.grammar_mask_s > 0 and 0 < st.grammar_mask_us_per_row <= 1e6 * st.grammar_mask_s
        return conv.chat, before, after, rec.prompts


@pytest.mark.parametrize("name,role", [("hermes", "system"), ("gemma", "merged")])
def test_the_hint_is_a_message_of_its_own_for_one_round(name, role, tmp_path_factory):
    """SmolLM2's template takes a system message anywhere; Gemma 3's roles must alternate, so the
    hint follows the question in its user turn."""
    lm = _model(name, str(tmp_path_factory.getbasetemp() / "qwen"))
    schema = Joke.model_json_schema()
    chat, before, after, prompts = anyio.run(_two_rounds, lm, schema)
    hint = schema_hint(schema)
    gen = chat.generation_prompt_tokens()
    assert before[-len(gen):] == gen and prompts[0][-len(gen):] == gen
    messages = [{"role": "system", "content": "You tell jokes."}, {"role": "user", "content": "A cat joke."}]
    if role == "merged":
        messages[-1]["content"] += "\n\n" + hint
    else:
        messages.append({"role": role, "content": hint})
    assert chat.tokenizer.decode(prompts[0]) == chat.render(messages)  # (the template's own rendering)
    if role != "merged":  # (a message of its own: everything before it is the prompt without it)
        assert prompts[0][:len(before) - len(gen)] == before[:-len(gen)]
    assert prompts[1] == after and hint.splitlines()[1] not in chat.tokenizer.decode(after)


def test_json_mode_gets_no_hint(tmp_path_factory):
    lm = _model("hermes", str(tmp_path_factory.getbasetemp() / "qwen"))
    _, before, _, prompts = anyio.run(_two_rounds, lm, {"type": "object"})
    assert prompts[0] == before


def test_a_required_call_gets_no_hint(tmp_path_factory):
    """With tools and tool_choice "required" the reply is a call, never the schema's answer: no hint."""
    lm = _model("hermes", str(tmp_path_factory.getbasetemp() / "qwen"))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]

    async def main():
        async with Engine(lm, EngineConfig(kv_cache_tokens=4096, response_cache_size=0)) as eng:
            rec = _Recorder(eng)
            conv = Conversation(rec, tools=tools)
            conv.append([{"role": "user", "content": "Weather?"}])
            before = list(conv.tokens)
            async for end in conv.round(SamplingParams(max_tokens=64), json_schema=Joke.model_json_schema(),
                                        tool_choice="required"):
                pass
            return before, rec.prompts, end

    before, prompts, end = anyio.run(main)
    assert prompts == [before] and end.calls
