"""Delta encoding survives any template (Conversation.append on ChatFormat.extend).

Property: for random conversations (parallel tool calls, runs of tool results that Qwen2.5
merges into one turn, empty contents, system prompts ending in punctuation or whitespace,
unicode) appended in random batches, the conversation's token ids decode to the template's
full rendering, and they equal tokenizing that rendering at once, except at the one seam this
test names: a content holding control-token text (content is data, so `<|im_start|>` inside it
stays ordinary text where the whole-string tokenizer would make it a control token).
Templates: the real Qwen2.5 one (tests/fixtures) and SmolLM2's with the fallback tool format.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.conversation.chat_format import ChatFormat
from agentrt.conversation.conversation import Conversation
from tests.conftest import smol_tokenizer
from tests.qwen_fixture import qwen_tokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module", params=["qwen2.5", "smollm2"])
def chat(request, tmp_path_factory) -> ChatFormat:
    tok = qwen_tokenizer(tmp_path_factory.mktemp("q")) if request.param == "qwen2.5" else smol_tokenizer()
    return ChatFormat(tok)


_PIECES = ["a", "b", " ", "\n", "\n\n", ".", "!", ":", "é", "😀", "中", "12", "<|im_start|>", "<tool_call>",
           "{", "}", "Paris", " the"]
_text = st.lists(st.sampled_from(_PIECES), max_size=6).map("".join)
_arg = st.lists(st.sampled_from([p for p in _PIECES if "|" not in p]), max_size=4).map("".join)  # (forgeries refused)
_call = st.builds(lambda i, c: {"id": f"call_{i}", "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": c}}},
                  st.integers(0, 99), _arg)
_system = st.builds(lambda c, end: {"role": "system", "content": c + end}, _text, st.sampled_from([".", "!", " ", "\n", ""]))
_turn = st.one_of(
    st.builds(lambda c: [{"role": "user", "content": c or "hi"}], _text),
    st.builds(lambda c: [{"role": "assistant", "content": c or "ok"}], _text),
    st.builds(lambda c, calls, results: [{"role": "assistant", "content": c or None, "tool_calls": calls}]
              + [{"role": "tool", "tool_call_id": call["id"], "content": r} for call, r in zip(calls, results)],
              _text, st.lists(_call, min_size=1, max_size=3), st.lists(_text, min_size=3, max_size=3)),
)


def _conversation(draw_system, turns) -> list[dict]:
    msgs = [draw_system] if draw_system is not None else []
    for t in turns:
        msgs += t
    return msgs


def _control_text(chat: ChatFormat, messages: list[dict]) -> bool:
    texts = [m.get("content") or "" for m in messages]
    return any(t in x for x in texts for t in chat.tokenizer.special_tokens)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(system=st.one_of(st.none(), _system), turns=st.lists(_turn, min_size=1, max_size=4), data=st.data(),
       with_tools=st.booleans())
def test_appended_batches_equal_the_full_rendering(chat, system, turns, data, with_tools):
    messages = _conversation(system, turns)
    if messages[0]["role"] != "system" and messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": "start"})
    tools = [WEATHER] if with_tools else None
    cuts = sorted(data.draw(st.sets(st.integers(1, len(messages) - 1), max_size=len(messages)))) \
        if len(messages) > 1 else []
    conv = Conversation(None, tools=tools, chat=chat)
    for a, b in zip([0, *cuts], [*cuts, len(messages)]):
        conv.append(messages[a:b])  # e.g. Qwen: a tool result alone, then the next one merges with it
        for k, end in conv.ends.items():  # every boundary it records is exact
            assert end == len(chat.encode(messages[:k], tools, add_generation_prompt=False)) if k else end == 0
    rendered = chat.render(messages, tools, add_generation_prompt=True)
    assert chat.tokenizer.decode(conv.tokens) == rendered
    if not _control_text(chat, messages):
        assert conv.tokens == chat.tokenizer.encode(rendered, special=True)
    assert conv.tokens == chat.encode(messages, tools)


def test_merged_tool_results_reencode_only_the_merged_turn(tmp_path):
    chat = ChatFormat(qwen_tokenizer(tmp_path))
    def call(i, c):
        return {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}
    head = [{"role": "system", "content": "You answer with tools."}, {"role": "user", "content": "Paris and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [call(1, "Paris"), call(2, "Rome")]}]
    conv = Conversation(None, tools=[WEATHER], chat=chat)
    conv.append(head)
    conv.append([{"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
    before = conv.ends[3]
    conv.append([{"role": "tool", "tool_call_id": "c2", "content": "rain"}])
    assert conv.ends[3] == before and 4 not in conv.ends  # the merged turn has no boundary inside
    assert conv.tokens == chat.encode(head + [{"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                              {"role": "tool", "tool_call_id": "c2", "content": "rain"}], [WEATHER])
    text = chat.tokenizer.decode(conv.tokens)
    assert text.count("<|im_start|>user") == 2 and "</tool_response>\n<tool_response>\nrain" in text


def test_system_prompt_punctuation_tokenizes_as_in_the_full_rendering(tmp_path):
    chat = ChatFormat(qwen_tokenizer(tmp_path))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = chat.render(msgs, [WEATHER])
    assert ".\n\n# Tools" in rendered
    assert chat.encode(msgs, [WEATHER]) == chat.tokenizer.encode(rendered, special=True)
