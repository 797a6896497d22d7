"""The chat template's tool-result markers end an assistant reply (issue 57: answers ended with
`<tool_response>\\n{"city": "Paris", ...}`): the markers read off each family's template, a reply
cut before the first one wherever the decoded pieces split it, and an agent's answer after a tool
result keeping only the text before the marker (scripted replies, the real engine and format).
The role headers too: the control tokens a template writes between messages stop a reply that
starts a new message, per family, and the agent's answer keeps what came before."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import anyio
import pytest

from agentrt import Agent, Engine, EngineConfig, Runtime, tool
from agentrt.conversation.chat_format import ChatFormat
from agentrt.conversation.round_state import RoundState, TextOnly
from agentrt.toolcall.formats import HERMES
from tests.conftest import smol_tokenizer
from tests.family_templates import gemma3_tokenizer, phi4_mini_tokenizer
from tests.qwen_fixture import qwen_tokenizer
from tests.scripted_model import scripted
from tests.test_formats_agent import LLAMA3_STYLE, MISTRAL_STYLE, _smol_variant

FAMILIES = {  # family -> (its tokenizer and template, the markers expected)
    "hermes (SmolLM2)": (smol_tokenizer, ("<tool_response>", "</tool_response>")),
    "qwen": (lambda: qwen_tokenizer(Path(tempfile.mkdtemp())), ("<tool_response>", "</tool_response>")),
    "mistral": (lambda: _smol_variant(MISTRAL_STYLE, ("[TOOL_CALLS]",)), ("[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
    # tool results as control tokens (the decoder drops them) or as plain text: no markup to stop at
    "llama3": (lambda: _smol_variant(LLAMA3_STYLE), ()),
    "phi4": (phi4_mini_tokenizer, ()),
    "gemma": (gemma3_tokenizer, ()),
}


ROLE_HEADERS = {  # family -> the control tokens its template writes between two messages
    "hermes (SmolLM2)": ("<|im_end|>", "<|im_start|>"),
    "qwen": ("<|im_end|>", "<|im_start|>"),
    "mistral": ("<|im_end|>",),  # (the variant on SmolLM2's vocabulary: [INST] is plain text there)
    "llama3": ("<|im_end|>", "<|im_start|>"),  # (likewise: ChatML's tokens in a Llama 3 layout)
    "phi4": ("<|end|>", "<|assistant|>", "<|user|>"),
    "gemma": ("<end_of_turn>", "<start_of_turn>"),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_template_gives_its_role_headers_as_stop_ids(family):
    make, _ = FAMILIES[family]
    chat = ChatFormat(make())
    names = {i: s for s, i in chat.tokenizer.special_tokens.items()}
    assert tuple(names[i] for i in chat.role_stop_ids) == ROLE_HEADERS[family]
    assert chat.tool_format.open not in {names[i] for i in chat.role_stop_ids}


def test_a_reply_that_starts_a_new_message_ends_there():
    """The model writes the end of its turn late: `<|im_start|>user` (a control token the decoder
    drops) used to hand `user\nAnd in Tokyo?` on as part of the answer."""
    def reply(prompt: str) -> str:
        return "It is sunny in Paris.<|im_start|>user\nAnd in Tokyo?"

    async def main():
        async with Engine(scripted(reply, special=True), EngineConfig(kv_cache_tokens=8192)) as eng, \
                Runtime(eng) as rt:
            ref = await rt.spawn(Agent("w", "Answer briefly.", engine=eng), name="w")
            return await ref.ask("What is the weather in Paris?")
    result = anyio.run(main)
    assert result.text == "It is sunny in Paris."


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_template_gives_its_tool_result_markers(family):
    make, want = FAMILIES[family]
    chat = ChatFormat(make())
    assert chat.template_stops == want
    assert chat.tool_format.open not in chat.template_stops or not chat.tool_format.open  # (calls are never cut)


@pytest.mark.parametrize("family", [f for f, (_, want) in FAMILIES.items() if want])
def test_a_reply_ends_where_the_model_writes_a_marker_however_it_is_split(family):
    make, want = FAMILIES[family]
    chat = ChatFormat(make())
    answer = "It is 18 C in Paris.\n"
    text = answer + want[0] + '\n{"city": "Paris", "temperature_c": 18}\n' + want[1]
    rng = random.Random(0)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        state = RoundState(TextOnly(), chat.template_stops, False, True)
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            state.feed(text[a:b])
            if state.stopped:
                break
        assert state.stopped and "".join(state.text) == answer


@pytest.mark.parametrize("family", [f for f, (_, want) in FAMILIES.items() if want])
def test_a_reply_that_begins_with_a_marker_keeps_what_it_wraps(family):
    """A small model restating a tool result writes the wrapper first: the wrapper goes, the
    restated text stays (it is all the answer the model gives), the closing marker ends it."""
    make, want = FAMILIES[family]
    chat = ChatFormat(make())
    text = "\n" + want[0] + "\nIn Paris it is 18 C.\n" + want[1] + "\n" + want[0] + "more"
    rng = random.Random(1)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        state = RoundState(TextOnly(), chat.template_stops, False, True, chat.template_stops)
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            state.feed(text[a:b])
            if state.stopped:
                break
        assert state.stopped and "".join(state.text).strip() == "In Paris it is 18 C."


def test_an_agent_answer_after_a_tool_result_keeps_only_the_text_before_the_marker():
    @tool
    def get_weather(city: str) -> dict:
        """Current weather in a city."""
        return {"city": city, "temperature_c": 18}

    def reply(prompt: str) -> str:
        if "temperature_c" not in prompt:  # (the tool result is not in the prompt yet)
            return HERMES.render_calls([("get_weather", {"city": "Paris"})])
        return 'It is 18 C in Paris.<tool_response>\n{"city": "Paris", "temperature_c": 18}\n</tool_response>'

    async def main():
        async with Engine(scripted(reply), EngineConfig(kv_cache_tokens=8192)) as eng, Runtime(eng) as rt:
            ref = await rt.spawn(Agent("w", "Answer with the tool.", [get_weather], engine=eng), name="w")
            return await ref.ask("What is the weather in Paris?")
    result = anyio.run(main)
    assert result.text == "It is 18 C in Paris." and [r.content for r in result.tool_results] == [
        '{"city": "Paris", "temperature_c": 18}']
