"""The tool grammar writes each model family's own format (formats.py): what the format's
parser reads is accepted token by token, the other families' forms are rejected."""

from __future__ import annotations

import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from agentrt.constrain.grammar import GrammarFactory
from agentrt.model.tokenizer import Tokenizer, byte_to_unicode
from agentrt.toolcall import CallComplete, ToolCallParser
from agentrt.toolcall.formats import FORMATS, HERMES, LLAMA3, MISTRAL, QWEN
from tests.test_grammar import TOOLS, WEATHER

PARIS = ("get_weather", {"city": "Paris"})
OSLO = ("get_time", {"timezone": "UTC"})


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """Byte-level BPE whose control tokens include Mistral's [TOOL_CALLS]."""
    vocab = {ch: i for i, ch in enumerate(byte_to_unicode())}
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ("<|im_end|>", "<|im_start|>", "[TOOL_CALLS]")])
    return Tokenizer(backend, eos_token_ids=[backend.token_to_id("<|im_end|>")])


def ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, special=True) + [tok.eos_token_ids[0]]


def accepted(factory: GrammarFactory, choice, text: str, tok: Tokenizer, parallel: bool = True) -> bool:
    c = factory.for_tools(TOOLS, choice, parallel_tool_calls=parallel)
    toks = ids(tok, text)
    return c.accepts_prefix(toks) == len(toks)


@pytest.mark.parametrize("backend", ["xgrammar", "llguidance"])
@pytest.mark.parametrize("name", list(FORMATS))
def test_required_and_named_write_the_family_format(tok, name, backend):
    fmt = FORMATS[name]
    factory = GrammarFactory(tok, tok.vocab_size, tool_format=fmt, backend=backend)
    one = fmt.render_calls([PARIS])
    assert accepted(factory, "required", one, tok)
    assert accepted(factory, "get_weather", one, tok)
    assert not accepted(factory, "get_time", one, tok)
    two = fmt.render_calls([PARIS, OSLO])
    assert accepted(factory, "required", two, tok) == fmt.parallel
    for other in FORMATS.values():
        if other.render_calls([PARIS]) != one:
            assert not accepted(factory, "required", other.render_calls([PARIS]), tok), other.name
    # what the grammar writes, the format's parser reads
    parser = ToolCallParser(TOOLS, **fmt.parser_options())
    events = parser.feed(two if fmt.parallel else one) + parser.close()
    assert [e.name for e in events if isinstance(e, CallComplete)] == (["get_weather", "get_time"]
                                                                      if fmt.parallel else ["get_weather"])


@pytest.mark.parametrize("name", list(FORMATS))
def test_auto_allows_text_or_calls(tok, name):
    fmt = FORMATS[name]
    factory = GrammarFactory(tok, tok.vocab_size, tool_format=fmt)
    assert accepted(factory, "auto", "It is sunny in Paris.", tok)
    assert accepted(factory, "auto", fmt.render_calls([PARIS]), tok)
    bad = fmt.render_calls([("get_weather", {"town": "Paris"})])
    assert not accepted(factory, "auto", bad, tok)
    if fmt.open:  # text then calls
        assert accepted(factory, "auto", "Let me check. " + fmt.render_calls([PARIS]), tok)


def test_the_mistral_tag_is_its_control_token(tok):
    factory = GrammarFactory(tok, tok.vocab_size, tool_format=MISTRAL)
    c = factory.for_tools([WEATHER], "required")
    assert c.allowed()[tok.special_tokens["[TOOL_CALLS]"]]
    assert not c.allowed()[tok.special_tokens["<|im_start|>"]]
    assert QWEN.render_calls([PARIS]).startswith("<tool_call>\n{") and LLAMA3.render_calls([PARIS]).startswith("{")
    assert HERMES.render_calls([PARIS]).startswith('<tool_call>{"name"')
