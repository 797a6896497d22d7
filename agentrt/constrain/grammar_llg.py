"""The llguidance grammar backend (grammar_backends.py describes the language both backends
implement): tool-call grammars as Lark with %json for each tool's parameters, schema answers
with the same JSON options, and a matcher that keeps rollback exact past the end of output."""

from __future__ import annotations

import json
from typing import Any

import torch

from agentrt.constrain.grammar_backends import GrammarSpec, Matcher, load_library, vocab_table
from agentrt.constrain.schema_errors import unsupported
from agentrt.errors import GrammarError
from agentrt.model.tokenizer import Tokenizer
from agentrt.toolcall.formats import ITEM_SEP, KEY_SEP


class _VocabView:
    """The token table llguidance.TokenizerWrapper reads (special tokens start with 0xFF)."""

    def __init__(self, tokenizer: Tokenizer, vocab: list[bytes], special: frozenset[int], size: int) -> None:
        self.eos_token_id = tokenizer.eos_token_ids[0]
        self.bos_token_id = tokenizer.bos_token_id
        pad = [b"\xff[padding %d]" % i for i in range(len(vocab), size)]
        self.tokens = [b"\xff" + p if i in special else p for i, p in enumerate(vocab)] + pad
        self.special_token_ids = sorted(special)
        self._tok = tokenizer

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text)


class LLGuidanceBackend:
    """llguidance: a Lark grammar with inline JSON schemas; the Earley parser computes each mask."""

    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, text_tokens: frozenset[int] = frozenset()) -> None:
        self._llg = llg = load_library("llguidance")
        vocab, special = vocab_table(tokenizer, vocab_size, text_tokens)
        view = _VocabView(tokenizer, vocab, special, vocab_size)
        self._tok = llg.LLTokenizer(llg.TokenizerWrapper(view), n_vocab=vocab_size,
                                    eos_token=list(tokenizer.eos_token_ids))
        self._eos = frozenset(tokenizer.eos_token_ids)

    def compile(self, spec: GrammarSpec) -> Any:
        """A matcher at the start state; matcher() hands out deep copies of it."""
        llg = self._llg
        if spec.kind == "json":
            grammar = llg.LLMatcher.grammar_from_json_schema(spec.schema_json, overrides=_JSON_OPTIONS)
        else:
            grammar = llg.LLMatcher.grammar_from_lark(self._lark(spec))
        error = llg.LLMatcher.validate_grammar(grammar, self._tok)
        if error:
            raise self._culprit(spec, error)
        return llg.LLMatcher(self._tok, grammar, log_level=0)

    def _culprit(self, spec: GrammarSpec, error: str) -> GrammarError:
        """The typed error naming the schema that fails: the response schema, or the first tool
        whose parameters fail alone (none: the grammar around them, a GrammarError)."""
        if spec.kind == "json":
            return unsupported("llguidance", error, tool=None, schema_text=spec.schema_json)
        for call in spec.calls:
            alone = self._llg.LLMatcher.grammar_from_json_schema(call.parameters_json, overrides=_JSON_OPTIONS)
            if own := self._llg.LLMatcher.validate_grammar(alone, self._tok):
                return unsupported("llguidance", own, tool=call.name, schema_text=call.parameters_json)
        return GrammarError(f"llguidance cannot compile this tool grammar: {error}")

    @staticmethod
    def _lark(spec: GrammarSpec) -> str:
        f = spec.format
        if spec.free_text and not (f.open and not f.list_calls):
            raise GrammarError(f"the llguidance backend has no tool_choice auto grammar for the {f.name} "
                               "format; use the xgrammar backend")
        names = " | ".join(f"call_{i}" for i in range(len(spec.calls)))
        end = json.dumps("}" + f.block_end)
        more = f' ({json.dumps(f.separator)} block)*' if spec.parallel else ""
        lines = ["%llguidance {}", f"block: {_lit(f.block_begin)} ({names}) {end}",
                 f"calls: block{more}"]
        if spec.free_text:  # text never holding the tag, or text up to the first tag + calls
            lines += ["start: PLAIN | head calls_after",
                      f"PLAIN: /(?s:.*)/ & ~/(?s:.*){_lark_re(f.open)}(?s:.*)/",
                      f"head[lazy]: /(?s:.*){_lark_re(f.open)}/",
                      f"calls_after: {_lit(f.inner)} ({names}) {end}{more}"]
        else:
            body = f"{json.dumps(f.open + '[')} calls {json.dumps(']' + f.close)}" if f.list_calls else "calls"
            if spec.answer_json:  # the calls, or an answer matching the response schema
                answer = {**json.loads(spec.answer_json), "x-guidance": _JSON_OPTIONS} \
                    if spec.answer_json not in ("true", "false") else json.loads(spec.answer_json)
                lines += [f"start: {body} | answer", f"answer: %json {json.dumps(answer)}"]
            else:
                lines.append(f"start: {body}")
        for i, call in enumerate(spec.calls):
            schema = {**json.loads(call.parameters_json), "x-guidance": _JSON_OPTIONS}
            prefix = f.call_prefix(call.name)
            lines.append(f"call_{i}: {json.dumps(prefix, ensure_ascii=False)} %json {json.dumps(schema)}")
        return "\n".join(lines) + "\n"

    def matcher(self, compiled: Any) -> Matcher:
        return _LlgMatcher(compiled.deep_copy(), self._eos)


# \u escapes of any character are valid JSON (json.dumps writes them by default)
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ITEM_SEP, "key_separator": KEY_SEP,
                 "json_allow_general_unicode_escapes": True}


def _lit(text: str) -> str:
    """A lark string literal, or nothing for the empty string."""
    return json.dumps(text, ensure_ascii=False) if text else ""


def _lark_re(text: str) -> str:
    """`text` as a literal inside /.../ (Rust regex syntax: escape only its metacharacters)."""
    return "".join("\\" + ch if ch in _REGEX_META else ch for ch in text)


_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~/")


class _LlgMatcher:
    """llguidance stops (NoExtension) once nothing but eos can follow; it then refuses to
    *validate* the eos and consumes it without counting it for rollback. The end of the output
    is tracked here so that rollback stays exact."""

    def __init__(self, m: Any, eos: frozenset[int]) -> None:
        self._m, self._eos = m, eos
        self._ended = False
        self._eos_counted = False  # whether llguidance counts the accepted eos as a token

    def fill(self, bitmask: torch.Tensor) -> None:
        row = bitmask[0]
        self._m.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token: int) -> bool:
        if self._ended:
            return False
        if token in self._eos:
            stopped = self._m.is_stopped()
            if not (self._m.is_accepting() and self._m.consume_token(token)):
                return False
            self._ended, self._eos_counted = True, not stopped
            return True
        # validate first: consuming a bad token would leave the matcher in its error state
        return self._m.validate_tokens([token]) == 1 and self._m.consume_token(token)

    def rollback(self, n: int) -> None:
        if self._ended and n > 0:  # the eos is the last token accepted
            n -= 0 if self._eos_counted else 1
            self._ended = False
        if n:
            self._m.rollback(n)

    def is_terminated(self) -> bool:
        return self._ended

    def completed(self) -> bool:
        return not self._ended and bool(self._m.is_accepting())

    def forced_bytes(self) -> bytes:
        return b"" if self._ended else bytes(self._m.compute_ff_bytes())
