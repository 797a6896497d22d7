"""Constrained decoding of tool calls and structured output (a LogitsConstraint per request).

    factory = GrammarFactory(tokenizer, model.cfg.vocab_size)      # once per model
    constraint = factory.for_tools(tools, tool_choice)              # per request; None = free
    constraint = factory.for_json_schema(schema)                    # structured output
    constraint = factory.for_tools(tools, "auto", answer_schema=schema)  # calls, or a schema answer

The language (see grammar_backends.py) is the model family's tool-call format
(`GrammarFactory(..., tool_format=)`, `toolcall/formats.py`; default: ChatFormat's fallback
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, calls separated by "\\n"), then the
end-of-turn token. tool_choice (OpenAI / LangChain values):
  * "none", or no tools            -> None: no constraint, nothing is built (zero cost);
  * "auto" (or None with tools)    -> free text; once the model writes "<tool_call>", a valid call
                                      of a declared tool must follow (then more calls or the end);
  * "required" (alias "any")       -> one call, or several when parallel_tool_calls;
  * "<name>" / {"type": "function", "function": {"name": "<name>"}} -> exactly one call of it.
An unknown tool name is a ConfigError; a schema the backend cannot compile is a GrammarError.

Backend choice, measured by bench/bench_grammar.py --quick (SmolLM2 vocabulary of 49152, six
tools with nested objects, enums, arrays and required fields, a valid six-call output of 394
tokens forced through; 1 thread on a shared 2-core CPU):
                        mask us/token p50 / p90   compile ms   one-off tokenizer setup ms
    xgrammar            4.1 / 14.6                51           1292 (most of it the import)
    llguidance          33.5 / 79.1               9.7          241
    (tool_choice auto:  xgrammar 4.5 / 17.5 us, llguidance 20.6 / 51.5 us)
xgrammar is chosen: its mask is 5-8x cheaper on the path that runs for every token of every
constrained request, while a compile happens once per distinct tool set (cached here). It also
rolls back natively and needs no end-of-output bookkeeping. Applying the mask to a logits row
(apply_bitmask, backend-independent) takes ~11 us in the compiled kernel (masked AVX-512 stores;
the numpy/torch fallback 30-95 us depending on the mask). The engine times both on the step's
critical path: `stats().grammar_mask_us_per_row`.
llguidance stays available (`GrammarFactory(..., backend="llguidance")`) with the same language.

Speculative decoding: `accepts_prefix(tokens)` counts how many draft tokens the grammar accepts
in order without changing the state, and `rollback(n)` undoes the last n accepted tokens
(both backends support unlimited rollback; an accepted end-of-turn token can be rolled back).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from agentrt.constrain.forcing import ForcedText, Jump
from agentrt.constrain.grammar_backends import Backend, Matcher, XGrammarBackend, schema_json
from agentrt.constrain.grammar_llg import LLGuidanceBackend
from agentrt.constrain.grammar_specs import calls_spec, choice_mode, json_spec, tools_key
from agentrt.constrain.masks import apply_bitmask, bit, bitmask_words, low_bits
from agentrt.errors import ConfigError
from agentrt.model.tokenizer import Tokenizer
from agentrt.records.constraint import LogitsConstraint
from agentrt.toolcall.formats import HERMES, ToolFormat, keep_token_ids

# name -> its class, called (tokenizer, vocab_size, text_tokens)
BACKENDS: Mapping[str, Callable[[Tokenizer, int, frozenset[int]], Backend]] = MappingProxyType(
    {"xgrammar": XGrammarBackend, "llguidance": LLGuidanceBackend})
DEFAULT_BACKEND = "xgrammar"


class ToolCallConstraint(LogitsConstraint):
    """The grammar state of one request. Used by one thread at a time.

    A token the grammar rejects (only possible when the mask was not applied) does not raise
    inside the engine's step: the constraint records `error` and reports terminated, so the
    request ends instead of continuing unconstrained.
    """

    def __init__(self, matcher: Matcher, vocab_size: int, eos_ids: Sequence[int],
                 forced: ForcedText | None = None) -> None:
        self._m = matcher
        self._forced = forced
        self._width = vocab_size
        self._bitmask = torch.full((1, bitmask_words(vocab_size)), -1, dtype=torch.int32)
        self._words = self._bitmask.numpy()[0]  # the same memory, for cheap word operations
        # bits past the vocabulary in the last word: backends may set them; cleared after fill
        self._tail = low_bits(vocab_size % 32) if vocab_size % 32 else None
        self._eos = tuple(eos_ids)
        self._accepted = 0
        self._ready = False  # the bitmask holds the current state's mask (prepare())
        self.error: str | None = None

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [V] (V = the model's vocabulary) masked in place; returned for convenience.
        Inference tensors (the model runs under inference_mode) are updated in that mode."""
        if not self._ready:
            self._fill()
        self._ready = False
        with torch.inference_mode(logits.is_inference()):
            apply_bitmask(logits, self._bitmask)
        return logits

    def prepare(self) -> None:
        """Fill the mask of the current state now, for the next mask_logits: the engine runs it
        in a worker thread while the model's forward runs (never beside another call on this
        constraint)."""
        self._fill()
        self._ready = True

    def advance(self, token: int) -> None:
        self._ready = False
        if self.error is not None:
            return
        if not self._m.accept(int(token)):
            self.error = f"token {token} is not allowed by the grammar at output position {self._accepted}"
            return
        self._accepted += 1

    def is_terminated(self) -> bool:
        return self.error is not None or self._m.is_terminated()

    @property
    def num_accepted(self) -> int:
        return self._accepted

    def allowed(self) -> torch.Tensor:
        """bool [V] (the model's vocabulary): the tokens the next step may produce."""
        self._fill()
        row = torch.zeros(self._width)
        apply_bitmask(row, self._bitmask)
        return row == 0

    def fast_forward(self, last: int | None, room: int) -> tuple[int, list[int]]:
        """Jump over the text the grammar forces after `last` (the token just accepted; None at
        the start): (replaced, ids), ids accepted in place of the last `replaced` tokens (0 or
        1: healed) and after them; at most `room` ids. (0, []) when nothing is forced
        (forcing.py)."""
        self._ready = False
        if self._forced is None or self.error is not None or self._m.is_terminated():
            return 0, []
        replaced, ids = Jump(self._m, self._forced, self._eos, self._raw_words).run(last, room)
        self._accepted += len(ids) - replaced
        return replaced, ids

    def _raw_words(self) -> np.ndarray:
        """The matcher's mask for the current state, padding bits past the vocabulary cleared."""
        self._m.fill(self._bitmask)
        if self._tail is not None:
            self._words[-1] &= self._tail
        return self._words

    def accepts_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar accepts in order from here; the state is unchanged."""
        if self.error is not None:
            return 0
        n = 0
        for t in tokens:
            if self._m.is_terminated() or not self._m.accept(int(t)):
                break  # (nothing follows the end: xgrammar warns when asked)
            n += 1
        if n:
            self._m.rollback(n)
        return n

    def rollback(self, n: int) -> None:
        """Undo the last n accepted tokens (e.g. rejected draft tokens). Also clears `error`:
        a rejected token was never accepted, so the state before it is intact."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self._accepted:
            raise ConfigError(f"rollback(n) needs 0 <= n <= {self._accepted} accepted tokens, got {n!r}")
        if n:
            self._m.rollback(n)
            self._accepted -= n
        self.error, self._ready = None, False

    def _fill(self) -> None:
        if self.error is None and not self.is_terminated():
            if self._raw_words().any():
                return
            self.error = "the grammar allows no token here (unsatisfiable schema?)"
        self._eos_only()

    def _eos_only(self) -> None:
        # after an error (or the end) only end-of-turn is offered, so the request finishes
        self._bitmask.zero_()
        for t in self._eos:
            self._bitmask[0, t // 32] |= bit(t % 32)


class GrammarFactory:
    """Builds constraints for one tokenizer and model vocabulary; caches compiled grammars per
    (tools, tool_choice, parallel) and per JSON schema, so each is compiled once. Thread-safe."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int | None = None, *,
                 backend: str = DEFAULT_BACKEND, cache_size: int = 64, tool_format: ToolFormat = HERMES) -> None:
        if backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        size = tokenizer.vocab_size if vocab_size is None else vocab_size
        if isinstance(size, bool) or not isinstance(size, int) or size < tokenizer.vocab_size:
            raise ConfigError(f"vocab_size must be an int >= the tokenizer's {tokenizer.vocab_size}, got {size!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigError(f"cache_size must be an int >= 1, got {cache_size!r}")
        if not isinstance(tool_format, ToolFormat):
            raise ConfigError(f"tool_format must be a ToolFormat, got {tool_format!r}")
        self.vocab_size = size
        self.tool_format = tool_format
        tags = keep_token_ids(tool_format, tokenizer)
        self.backend: Backend = BACKENDS[backend](tokenizer, size, tags)
        self.forced_text = ForcedText(tokenizer, tags)  # fast-forward's tables (~20 ms for 49k ids)
        self._eos = tokenizer.eos_token_ids
        self._cache: OrderedDict[Any, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.compiles = 0  # grammars compiled so far (cache misses)

    def for_tools(self, tools: object, tool_choice: object = "auto", *,
                  parallel_tool_calls: bool = True, answer_schema: object = None) -> ToolCallConstraint | None:
        """The constraint for a request offering `tools`, or None when nothing is constrained.
        `answer_schema` (tool_choice auto): instead of free text, the reply is either the calls
        or one JSON value matching it (tools and a response format in one round)."""
        if not isinstance(parallel_tool_calls, bool):
            raise ConfigError(f"parallel_tool_calls must be a bool, got {parallel_tool_calls!r}")
        mode, name = choice_mode(tool_choice)
        if mode == "none":
            return None
        if tools is None or (isinstance(tools, (Mapping, Sequence)) and len(tools) == 0):
            if mode == "auto":
                return None
            raise ConfigError(f"tool_choice {tool_choice!r} needs at least one tool")
        # a named tool is called once; some templates render one call per message
        parallel = parallel_tool_calls and mode != "named" and self.tool_format.parallel
        answer = ""
        if answer_schema is not None and mode == "auto":
            if not isinstance(answer_schema, (Mapping, bool)):
                raise ConfigError(f"answer_schema must be a JSON schema (dict or bool), got "
                                  f"{type(answer_schema).__name__}")
            answer = json_spec(answer_schema, schema_json(answer_schema)).schema_json
        key = ("tools", tools_key(tools), mode, name, parallel, answer)
        return self._constraint(key, lambda: calls_spec(tools, mode, name, parallel, self.tool_format, answer))

    def for_json_schema(self, schema: object) -> ToolCallConstraint:
        """The whole output is one JSON value matching `schema`, then end-of-turn."""
        if not isinstance(schema, (Mapping, bool)):
            raise ConfigError(f"schema must be a JSON schema (dict or bool), got {type(schema).__name__}")
        text = schema_json(schema)
        return self._constraint(("json", text), lambda: json_spec(schema, text))

    def _constraint(self, key: Any, spec: Any) -> ToolCallConstraint:
        with self._lock:
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
        if compiled is None:  # compile outside the lock; a racing duplicate is harmless
            compiled = self.backend.compile(spec())
            with self._lock:
                self.compiles += 1
                self._cache[key] = compiled
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return ToolCallConstraint(self.backend.matcher(compiled), self.vocab_size, self._eos, self.forced_text)
