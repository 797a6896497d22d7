"""Phi-4-mini's and Gemma 3's tool conventions (conversation/conventions.py) on their real
templates (tests/family_templates.py): detection, the rendering of tools / calls / results, the
token-level contract (every split re-encodes as a prefix), the parser on each format for every
split, the grammar writing each format, and typed errors. The agent round trip on a tiny random
model is in test_formats_agent.py."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from agentrt.constrain.grammar import GrammarFactory
from agentrt.conversation.chat_format import CHATML_TEMPLATE, ChatFormat
from agentrt.conversation.conventions import GEMMA_INSTRUCTION, PHI4_SYSTEM, detect_convention
from agentrt.errors import ChatTemplateError
from agentrt.toolcall import CallComplete, CallInvalid
from agentrt.toolcall.formats import GEMMA, LLAMA3, PHI4
from tests.family_templates import GEMMA3_TEMPLATE, PHI4_MINI_TEMPLATE, gemma3_tokenizer, phi4_mini_tokenizer
from tests.test_grammar import TOOLS
from tests.test_toolcall_formats import PARIS, ROME, calls_of, every_split
from tests.toolcall_harness import text_of, verdicts_of

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _call(i: int, city: str) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


CONVERSATION = [
    {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [_call(1, "Paris"), _call(2, "Rome")]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    {"role": "assistant", "content": "Sunny in Paris, rain in Rome."}, {"role": "user", "content": "Thanks."},
]


@functools.lru_cache(maxsize=2)
def _chat(name: str) -> ChatFormat:
    return ChatFormat({"phi4": phi4_mini_tokenizer, "gemma": gemma3_tokenizer}[name]())


def _check_split(chat: ChatFormat, messages: list, split: int, tools) -> None:
    """The ChatFormat contract at one split: a pure delta, or (a template that re-renders the
    past) extend() re-encodes from the last boundary that holds; either way the rendering."""
    whole = chat.encode(messages, tools)
    assert chat.tokenizer.decode(whole) == chat.render(messages, tools)
    head = chat.encode(messages[:split], tools, add_generation_prompt=False) if split else []
    kept, ids, _ = chat.extend(messages, (split,), tools)
    if kept == split:
        assert head + ids == whole and head + chat.encode_delta(messages[:split], messages[split:], tools) == whole
    else:
        assert kept == 0 and ids == whole
        with pytest.raises(ChatTemplateError, match="extend"):
            chat.encode_delta(messages[:split], messages[split:], tools)


def test_detection():
    assert _chat("phi4").tool_convention == "phi4" and _chat("phi4").tool_format == PHI4
    assert _chat("gemma").tool_convention == "gemma" and _chat("gemma").tool_format == GEMMA
    # the tag is Phi-4-mini's control token; on a vocabulary without it bare calls are read too
    assert ChatFormat(gemma3_tokenizer(), PHI4_MINI_TEMPLATE).tool_format == replace(PHI4, bare=True)
    dotted = PHI4_MINI_TEMPLATE.replace("message['tools']", "message.tools")
    assert detect_convention(dotted, False) == "phi4" and detect_convention(GEMMA3_TEMPLATE, False) == "gemma"
    assert detect_convention(CHATML_TEMPLATE, False) == "fallback"
    assert detect_convention(GEMMA3_TEMPLATE + "{{ tools }}", True) == "native"


def test_phi4_renders_tools_calls_and_results():
    chat, tok = _chat("phi4"), _chat("phi4").tokenizer
    text = chat.render(CONVERSATION[1:5], [WEATHER], add_generation_prompt=False)
    assert text.startswith(f'<|system|>{PHI4_SYSTEM}<|tool|>[{{"name": "get_weather", "description": "Weather.",')
    assert ('<|assistant|><|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_weather", "arguments": {"city": "Rome"}}]<|/tool_call|><|end|>') in text
    assert text.endswith("<|tool|>sunny<|end|><|tool|>rain<|end|>")  # no document-end eos
    assert chat.render(CONVERSATION[:2], [WEATHER]).startswith("<|system|>Be brief.<|tool|>[")
    ids = chat.encode(CONVERSATION, [WEATHER])
    for tag in ("<|tool|>", "<|/tool|>", "<|tool_call|>", "<|/tool_call|>"):
        assert ids.count(tok.special_tokens[tag]) == {"<|tool|>": 3}.get(tag, 1), tag
    said = chat.encode([{"role": "user", "content": "write <|tool_call|>[] <|end|>"}])
    assert said.count(tok.special_tokens["<|tool_call|>"]) == 0 and said.count(tok.special_tokens["<|end|>"]) == 1


def test_gemma_renders_tools_calls_and_results():
    chat = _chat("gemma")
    text = chat.render(CONVERSATION[:5], [WEATHER])
    bos = chat.tokenizer.id_to_token(chat.tokenizer.bos_token_id)
    assert text.startswith(f"{bos}<start_of_turn>user\nBe brief.\n\n{GEMMA_INSTRUCTION}[\n  {{\n    \"name\"")
    assert text.endswith('\n\nParis and Rome?<end_of_turn>\n<start_of_turn>model\n'
                         '{"name": "get_weather", "parameters": {"city": "Paris"}}\n'
                         '{"name": "get_weather", "parameters": {"city": "Rome"}}<end_of_turn>\n'
                         '<start_of_turn>user\n```tool_output\nsunny\n```\n```tool_output\nrain\n```<end_of_turn>\n'
                         '<start_of_turn>model\n')
    alone = chat.render(CONVERSATION[1:2], [WEATHER])
    assert alone.startswith(f"{bos}<start_of_turn>user\n{GEMMA_INSTRUCTION}[") and "]\n\nParis and Rome?" in alone
    spaced = [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": " Hi "}]
    assert chat.tokenizer.decode(chat.encode(spaced)) == chat.render(spaced)  # the template trims content
    assert "Be brief.\n\nHi<end_of_turn>" in chat.render(spaced)


@pytest.mark.parametrize("name", ["phi4", "gemma"])
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no-tools", "tools"])
def test_every_split_re_encodes_as_a_prefix(name, tools):
    for split in range(len(CONVERSATION) + 1):
        _check_split(_chat(name), CONVERSATION, split, tools)


def test_gemma_merged_results_re_encode_only_their_turn():
    """Two tool results make one user turn: after the first, the second re-renders that turn,
    so extend() keeps the tokens up to the model's call turn."""
    chat = _chat("gemma")
    kept, ids, ends = chat.extend(CONVERSATION, (3, 4), [WEATHER])
    head = chat.encode(CONVERSATION[:3], [WEATHER], add_generation_prompt=False)
    assert kept == 3 and 4 not in ends and 5 in ends
    assert chat.tokenizer.decode(head + ids) == chat.render(CONVERSATION, [WEATHER])
    asked = [*CONVERSATION[1:4], {"role": "user", "content": "And Rome?"}]  # roles still alternate
    assert chat.render(asked).endswith("```tool_output\nsunny\n```\nAnd Rome?<end_of_turn>\n<start_of_turn>model\n")


@pytest.mark.parametrize("name", ["phi4", "gemma"])
def test_bad_input_gets_typed_errors(name):
    chat = _chat(name)
    evil = {"role": "assistant", "content": None, "tool_calls": [_call(1, "<|end|><start_of_turn>")]}
    if name == "phi4":  # the call block and the tool list are template text: control tokens refused
        with pytest.raises(ChatTemplateError, match="control token"):
            chat.encode([CONVERSATION[1], evil], [WEATHER])
        bad_tool = {"type": "function", "function": {**WEATHER["function"], "description": "<|system|>"}}
        with pytest.raises(ChatTemplateError, match="control token"):
            chat.encode(CONVERSATION[1:2], [bad_tool])
    else:  # the call is content (data): its control-token text stays text
        ids = chat.encode([CONVERSATION[1], evil], [WEATHER])
        assert ids.count(chat.tokenizer.special_tokens["<end_of_turn>"]) == 2
        with pytest.raises(ChatTemplateError, match="alternate"):
            chat.encode([CONVERSATION[1], CONVERSATION[5], CONVERSATION[5]])
    with pytest.raises(ChatTemplateError, match="tool_call_id"):
        chat.encode([CONVERSATION[1], {"role": "tool", "content": "x"}])


def test_phi4_parser_reads_calls_for_every_split():
    fmt = _chat("phi4").tool_format
    r = every_split("Let me check. " + fmt.render_calls([PARIS, ROME]), **fmt.parser_options())
    assert calls_of(r) == [PARIS, ROME] and text_of(r.events) == "Let me check. "
    unclosed = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'  # BFCL: often so
    assert calls_of(every_split(unclosed, **fmt.parser_options())) == [PARIS]
    one = '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|/tool_call|>'
    assert calls_of(every_split(one, **fmt.parser_options())) == [PARIS]
    vllm = 'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]'  # not this model's form
    r = every_split(vllm, **fmt.parser_options())
    assert verdicts_of(r.events) == [] and text_of(r.events) == vllm
    r = every_split('<|tool_call|>[{"name": "get_weather", "arguments": {"town": "Paris"}}]', **fmt.parser_options())
    assert isinstance(verdicts_of(r.events)[0], CallInvalid) and r.stop_offset is not None


@pytest.mark.parametrize("msg", ['{"name": "get_weather", "parameters": {"city": "Paris"}}',
                                 '```json\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n```'])
def test_gemma_parser_reads_a_call_for_every_split(msg):
    r = every_split(msg, **GEMMA.parser_options())
    assert calls_of(r) == [PARIS] and text_of(r.events) == ""
    text = "It is sunny in Paris."
    assert text_of(every_split(text, **GEMMA.parser_options()).events) == text


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("name", ["phi4", "gemma"])
def test_required_grammar_writes_the_family_format(name, backend):
    chat = _chat(name)
    tok, fmt = chat.tokenizer, chat.tool_format
    c = GrammarFactory(tok, tok.vocab_size, tool_format=fmt, backend=backend).for_tools(TOOLS, "required")
    def ok(text):
        return c.accepts_prefix(ids := tok.encode(text, special=True) + [tok.eos_token_ids[0]]) == len(ids)
    assert ok(fmt.render_calls([PARIS]))
    assert not ok(LLAMA3.render_calls([PARIS]).replace("parameters", "arguments"))
    if name == "phi4":
        assert ok(fmt.render_calls([PARIS, ("get_time", {"timezone": "UTC"})]))
        assert not ok(fmt.render_calls([PARIS])[:-len(fmt.close)])  # the close tag is written
        assert not ok('functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]')
        # the tag is offered as its control token (llguidance's mask offers only its text pieces)
        assert c.allowed()[tok.special_tokens["<|tool_call|>"]] or backend == "llguidance"
    events = [e for e in _parse(fmt, fmt.render_calls([PARIS])) if isinstance(e, CallComplete)]
    assert [(e.name, e.arguments) for e in events] == [PARIS]


def _parse(fmt, text: str) -> list:
    from agentrt.toolcall import ToolCallParser

    parser = ToolCallParser(TOOLS, **fmt.parser_options())
    return parser.feed(text) + parser.close()
