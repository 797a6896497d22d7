"""Grammar backends: compile a `GrammarSpec` for one tokenizer and step a `Matcher` over tokens.

A GrammarSpec describes a language, not a library's grammar: either one JSON value matching a
schema (kind "json"), or tool calls in the model family's format (kind "calls", `toolcall/formats.py`);
for the Hermes format:

    block  =  '<tool_call>{"name": "<tool>", "arguments": ' ARGS '}</tool_call>'
    calls  =  block ('\\n' block)*            (parallel)   |   block    (single)
    output =  calls                           (free_text=False: tool_choice required / named)
           |  TEXT [calls]                    (free_text=True: tool_choice auto)
           |  calls | ANSWER                  (answer_json: auto with a response schema: the
                                               calls, or one JSON value matching it)

Other formats change the block's text around the call object (Qwen: "\\n" inside the tags;
Llama 3: a bare object with "parameters"), or wrap the calls in one list (Mistral:
`[TOOL_CALLS][call, call]`; Phi-4-mini: `<|tool_call|>[call, call]<|/tool_call|>`); a bare
format in auto is `calls | TEXT` (TEXT never holding '{"name"'). ARGS is the tool's parameters
schema as JSON; TEXT is any text without special tokens and without the format's trigger (once
the model writes it, the call grammar takes over). A special token that is one of the format's
tags ("[TOOL_CALLS]", "<|tool_call|>") is offered as its text. JSON is written with fixed
separators ", " and ": " and no other whitespace: the form json.dumps produces and ChatFormat's
tool prompt shows, and it keeps a small model from looping on whitespace. The name is a literal
in front of the arguments so each parameters schema stays a root document (its "$ref":
"#/$defs/..." keep resolving). Every output ends with one of the tokenizer's end-of-turn (eos)
tokens; only the eos is allowed once the grammar is complete.

Two backends implement it (xgrammar here, llguidance in grammar_llg.py); `grammar.py` picks xgrammar (see its docstring for the numbers).
Both mark the tokenizer's special tokens as never matching text, and ids between the
tokenizer's and the model's vocabulary size (padding rows) as never allowed. One difference:
xgrammar (strict mode) never writes properties a schema does not declare; llguidance follows
JSON Schema and allows them unless the schema says "additionalProperties": false. Another:
llguidance refuses a raw U+007F (DEL) inside a JSON string, which JSON and xgrammar allow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from agentrt.constrain.schema_errors import unsupported
from agentrt.errors import ConfigError, GrammarError
from agentrt.model.tokenizer import Tokenizer
from agentrt.toolcall.formats import HERMES, ITEM_SEP, KEY_SEP, ToolFormat

CALL_SEP = HERMES.separator


@dataclass(frozen=True)
class CallSpec:
    name: str
    parameters_json: str  # the parameters schema, canonical JSON (keeps the spec hashable)


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # "calls" | "json"
    calls: tuple[CallSpec, ...] = ()
    free_text: bool = False
    parallel: bool = True
    schema_json: str = ""  # kind == "json"
    format: ToolFormat = HERMES
    answer_json: str = ""  # kind == "calls": calls | one JSON value matching this schema (no text)


class Matcher(Protocol):
    """Grammar state of one output. fill() writes the allowed-token bitmask without moving."""

    def fill(self, bitmask: torch.Tensor) -> None: ...
    def accept(self, token: int) -> bool: ...  # False: rejected, state unchanged
    def rollback(self, n: int) -> None: ...
    def is_terminated(self) -> bool: ...  # an eos was accepted after a complete output
    def completed(self) -> bool: ...  # the output so far is complete (an eos may follow)
    def forced_bytes(self) -> bytes: ...  # the continuation the grammar forces from here


class Backend(Protocol):
    name: str

    def compile(self, spec: GrammarSpec) -> Any: ...
    def matcher(self, compiled: Any) -> Matcher: ...


def vocab_table(tokenizer: Tokenizer, vocab_size: int,
                text_tokens: frozenset[int] = frozenset()) -> tuple[list[bytes], frozenset[int]]:
    """The bytes of every tokenizer id and the special ids (less `text_tokens`, special tokens
    the grammar may write as their text: a format's tags). Needs a byte-level tokenizer."""
    if not tokenizer.byte_level:
        raise GrammarError("constrained decoding needs a byte-level BPE tokenizer (GPT-2 style); "
                           "this tokenizer has no fixed bytes per token")
    if not tokenizer.eos_token_ids:
        raise GrammarError("constrained decoding needs an end-of-turn token; the tokenizer declares none")
    if vocab_size < tokenizer.vocab_size:
        raise GrammarError(f"the model's vocabulary ({vocab_size}) is smaller than the "
                           f"tokenizer's ({tokenizer.vocab_size})")
    return ([tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)],
            frozenset(tokenizer.special_tokens.values()) - text_tokens)


def load_library(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise GrammarError(f"grammar backend {module!r} is not installed "
                           "(pip install 'agentrt[grammar]')") from exc


# -- xgrammar --------------------------------------------------------------------------------------

class XGrammarBackend:
    """xgrammar: a compiled grammar holds precomputed token masks; a GrammarMatcher per output."""

    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, text_tokens: frozenset[int] = frozenset()) -> None:
        self._xgr = xgr = load_library("xgrammar")
        vocab, special = vocab_table(tokenizer, vocab_size, text_tokens)
        # xgrammar treats empty-string tokens as special (never text); stop ids come from us
        encoded = [b"" if i in special else piece for i, piece in enumerate(vocab)]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=vocab_size,
                                 stop_token_ids=list(tokenizer.eos_token_ids))
        # the factory caches compiled grammars itself; no second, unbounded cache here
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, spec: GrammarSpec) -> Any:
        try:
            if spec.kind == "json":
                return self._compiler.compile_json_schema(
                    spec.schema_json, any_whitespace=False, separators=(ITEM_SEP, KEY_SEP))
            return self._compiler.compile_structural_tag(json.dumps(self._structural_tag(spec)))
        except GrammarError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError/its own types
            if spec.kind == "json":
                raise unsupported("xgrammar", _message(exc), tool=None, schema_text=spec.schema_json) from exc
            raise GrammarError(f"xgrammar cannot compile this tool grammar: {_message(exc)}") from exc

    def _structural_tag(self, spec: GrammarSpec) -> dict[str, Any]:
        f = spec.format
        tags = [{"type": "tag", "begin": f.block_begin + f.call_prefix(c.name), "content": self._args(c),
                 "end": "}" + f.block_end} for c in spec.calls]
        calls = {"type": "tags_with_separator", "tags": tags, "separator": f.separator,
                 "at_least_one": not (spec.free_text and f.open and not f.list_calls),
                 "stop_after_first": not spec.parallel}
        text = {"type": "any_text", "excludes": [f.trigger]}
        if spec.answer_json:  # the calls, or an answer matching the response schema
            calls["at_least_one"] = True
            if f.list_calls:
                calls = {"type": "tag", "begin": f.open + "[", "content": calls, "end": "]" + f.close}
            answer = {"type": "grammar", "grammar": self._json_grammar(spec.answer_json, None)}
            return {"type": "structural_tag", "format": {"type": "or", "elements": [calls, answer]}}
        if f.list_calls:  # open "[" calls "]", after optional text in auto
            listed = {"type": "tag", "begin": f.open + "[", "content": calls, "end": "]" + f.close}
            if not spec.free_text:
                return {"type": "structural_tag", "format": listed}
            maybe = {"type": "tags_with_separator", "tags": [listed], "separator": "", "stop_after_first": True}
            return {"type": "structural_tag", "format": {"type": "sequence", "elements": [text, maybe]}}
        if spec.free_text:
            both = [text, calls] if f.open else [calls, text]
            calls = {"type": "sequence" if f.open else "or", "elements": both}
        return {"type": "structural_tag", "format": calls}

    def _args(self, call: CallSpec) -> dict[str, Any]:
        # a grammar made from the schema (JSON-schema tag content has no separator option)
        return {"type": "grammar", "grammar": self._json_grammar(call.parameters_json, call.name)}

    def _json_grammar(self, schema_text: str, tool: str | None) -> str:
        try:
            grammar = self._xgr.Grammar.from_json_schema(schema_text, any_whitespace=False,
                                                         separators=(ITEM_SEP, KEY_SEP))
        except Exception as exc:
            raise unsupported("xgrammar", _message(exc), tool=tool, schema_text=schema_text) from exc
        return str(grammar)

    def matcher(self, compiled: Any) -> Matcher:
        return _XgrMatcher(self._xgr.GrammarMatcher(compiled))


def _message(exc: Exception) -> str:
    """xgrammar's message without its C++ log prefix ("[12:18:35] /project/cpp/x.cc:94: ")."""
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", str(exc).strip())


class _XgrMatcher:
    def __init__(self, m: Any) -> None:
        self._m = m

    def fill(self, bitmask: torch.Tensor) -> None:
        self._m.fill_next_token_bitmask(bitmask)

    def accept(self, token: int) -> bool:
        return bool(self._m.accept_token(token))

    def rollback(self, n: int) -> None:
        self._m.rollback(n)

    def is_terminated(self) -> bool:
        return bool(self._m.is_terminated())

    def completed(self) -> bool:
        return bool(self._m.is_completed())

    def forced_bytes(self) -> bytes:
        return self._m.find_jump_forward_string().encode("utf-8")


# -- llguidance ------------------------------------------------------------------------------------

def schema_json(value: Any) -> str:
    """The JSON text of a schema (any Mapping/Sequence types). Keys keep their order: the
    grammar writes properties in the order the schema declares them."""
    try:
        return json.dumps(value, ensure_ascii=False, default=_plain)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"schema is not JSON-serialisable: {exc}") from exc


def _plain(value: Any) -> Any:
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return list(value)
    if hasattr(value, "items"):  # a user schema's mapping by duck type (Mapping or not): written as a dict
        return dict(value.items())
    raise TypeError(f"{type(value).__name__} is not JSON")
