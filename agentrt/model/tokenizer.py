"""Tokenizer: a typed wrapper around a `tokenizers.Tokenizer`, built from GGUF metadata or tokenizer.json.

Two backends are kept per tokenizer:

* `_special`: matches added/control tokens (`<|im_start|>`...) in the text -> used for chat-template text;
* `_plain`:   a copy with `encode_special_tokens=True`, so control-token *strings* in the text are split
              into ordinary pieces. Used for user text and tool results, so they can never forge a turn.

`encode` never adds BOS/EOS; chat templates write those themselves (`add_bos_token` says whether
raw completion prompts should start with BOS).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from agentrt.errors import TokenizerError

# llama.cpp token types (tokenizer.ggml.token_type)
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

# Tokens that end an assistant turn in the chat formats we know; added to eos_token_ids when the
# vocabulary has them as special tokens, so generation stops on either end-of-turn or end-of-text.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "</s>")

# Pre-tokenizer split regexes, keyed by GGUF `tokenizer.ggml.pre`. These are the published
# patterns of the respective vocabularies (llama.cpp's llama-vocab.cpp uses the same ones).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
                 "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
# Vocabularies whose numbers (\p{N}) are split one character each before the GPT-2 regex: llama.cpp's
# SMOLLM/STARCODER group, whose HF tokenizer.json files use Digits(individual_digits=True) + ByteLevel.
# (transformers' GGUF conversion knows no "smollm" and skips this; ids then differ on e.g. " ²".)
_DIGIT_SPLIT_PRES = frozenset({"smollm", "starcoder", "refact", "codeshell", "command-r", "exaone"})


@lru_cache(maxsize=1)
def byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's byte-level alphabet: entry b is the printable character that stands for byte b."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:  # control bytes and space get code points above 255, in byte order
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


@lru_cache(maxsize=1)
def unicode_to_byte() -> Mapping[str, int]:
    """Inverse of byte_to_unicode (read-only)."""
    return MappingProxyType({ch: b for b, ch in enumerate(byte_to_unicode())})


class Tokenizer:
    """Text <-> token ids for one model. Thread-safe for concurrent encode/decode (no mutable state)."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None = None,
        eos_token_ids: Iterable[int] = (),
        pad_token_id: int | None = None,
        chat_template: str | None = None,
        add_bos_token: bool = False,
    ) -> None:
        self._special = backend
        self._plain = tokenizers.Tokenizer.from_str(backend.to_str())
        self._plain.encode_special_tokens = True  # control-token strings become ordinary text
        added = backend.get_added_tokens_decoder()  # {id: AddedToken}
        self.special_tokens: dict[str, int] = {t.content: i for i, t in added.items() if t.special}
        self._special_ids = frozenset(self.special_tokens.values())
        self.bos_token_id = bos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.pad_token_id = pad_token_id if pad_token_id is not None else (self.eos_token_ids or (None,))[0]
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        # 1 + highest id (not the entry count: GGUF vocabularies may repeat a token string)
        self.vocab_size: int = 1 + max(backend.get_vocab(with_added_tokens=True).values(), default=-1)
        self._token_bytes = self._byte_table() if isinstance(backend.decoder, decoders.ByteLevel) else None

    # -- encoding -----------------------------------------------------------------------------------
    def encode(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of `text`. special=False: `<|im_start|>` etc. in the text are ordinary characters."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode() takes a str, got {type(text).__name__}")
        backend = self._special if special else self._plain
        return backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self._special.decode(list(ids), skip_special_tokens=skip_special)

    def token_to_id(self, token: str) -> int | None:
        return self._special.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._special.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    @property
    def byte_level(self) -> bool:
        """True when every token maps to a fixed byte string (GPT-2 style byte-level BPE)."""
        return self._token_bytes is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes token `token_id` stands for (byte-level tokenizers only)."""
        if self._token_bytes is None:
            raise TokenizerError("token_bytes() needs a byte-level tokenizer; use IncrementalDecoder instead")
        if not 0 <= token_id < len(self._token_bytes):
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (size {len(self._token_bytes)})")
        return self._token_bytes[token_id]

    def _byte_table(self) -> tuple[bytes, ...]:
        # Byte-level tokens are spelled in GPT-2's alphabet; added tokens are spelled as their text.
        decode_map = unicode_to_byte()
        added = self._special.get_added_tokens_decoder()
        pieces = [""] * self.vocab_size  # ids missing from the vocabulary decode to b""
        for piece, i in self._special.get_vocab(with_added_tokens=True).items():
            if 0 <= i < self.vocab_size:
                pieces[i] = piece
        table = []
        for i, piece in enumerate(pieces):
            if i in added or not all(ch in decode_map for ch in piece):
                table.append(piece.encode("utf-8"))
            else:
                table.append(bytes(decode_map[ch] for ch in piece))
        return tuple(table)


class IncrementalDecoder:
    """Streams text for one sequence of generated ids: `push(id)` returns the new text.

    Incomplete UTF-8 sequences (an emoji split over tokens) are held back until complete, so no
    U+FFFD appears mid-character; `flush()` returns whatever is left at the end of the stream.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False, keep: Iterable[int] = ()) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._keep = frozenset(keep)  # special ids shown even when skip_special (a format's call tag)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []  # generic path: ids since the last emitted boundary
        self._prefix_len = 0  # generic path: chars of decode(self._ids) already emitted

    def push(self, token_id: int) -> str:
        if self._skip_special and self._tok.is_special(token_id) and token_id not in self._keep:
            return ""
        if self._tok.byte_level:
            return self._utf8.decode(self._tok.token_bytes(token_id))
        return self._push_generic(token_id)

    def _push_generic(self, token_id: int) -> str:
        # Non byte-level (e.g. sentencepiece with byte fallback): re-decode a short window and emit
        # the new suffix once it no longer ends in a replacement character.
        self._ids.append(token_id)
        text = self._tok.decode(self._ids, skip_special=self._skip_special)
        if text.endswith("\ufffd") or len(text) <= self._prefix_len:
            return ""
        delta = text[self._prefix_len:]
        # keep the last token as context: some decoders strip a leading space from the first piece
        self._ids = self._ids[-1:]
        self._prefix_len = len(self._tok.decode(self._ids, skip_special=self._skip_special))
        return delta

    def flush(self) -> str:
        if self._tok.byte_level:
            return self._utf8.decode(b"", final=True)
        text = self._tok.decode(self._ids, skip_special=self._skip_special)
        delta = text[self._prefix_len:]
        self._ids, self._prefix_len = [], 0
        return delta


def end_of_turn_ids(backend: tokenizers.Tokenizer, declared: Iterable[int | None]) -> tuple[int, ...]:
    """Declared eos ids first, then the known end-of-turn tokens this vocabulary has as special tokens."""
    special = {t.content: i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    ids = [i for i in declared if i is not None]
    ids += [special[name] for name in END_OF_TURN_TOKENS if name in special]
    return tuple(dict.fromkeys(ids))


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> Tokenizer:
    """Build the tokenizer described by GGUF metadata (`tokenizer.ggml.*` keys)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise TokenizerError(
            f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE, 'gpt2'); "
            "load the model from a Hugging Face directory with tokenizer.json instead"
        )
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or ())
    merges = meta.get("tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise TokenizerError("GGUF metadata lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
    types = list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))
    backend = _bpe_backend(tokens, types, merges, meta.get("tokenizer.ggml.pre"))
    if max(backend.get_vocab(with_added_tokens=True).values()) >= len(tokens):
        raise TokenizerError("GGUF control/user-defined tokens are missing from tokenizer.ggml.tokens")
    declared = [meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    return Tokenizer(
        backend,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=end_of_turn_ids(backend, declared),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        chat_template=meta.get("tokenizer.chat_template"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


def _bpe_backend(tokens: list[str], types: list[int], merges: Sequence[str], pre: str | None) -> tokenizers.Tokenizer:
    alphabet = unicode_to_byte()
    spell = byte_to_unicode()

    def respell(tok: str, kind: int) -> str:
        # A few GGUF writers store normal tokens as raw text; the BPE model wants GPT-2's alphabet.
        if kind != _NORMAL or all(ch in alphabet for ch in tok):
            return tok
        return "".join(spell[b] for b in tok.encode("utf-8"))

    vocab = {respell(tok, kind): i for i, (tok, kind) in enumerate(zip(tokens, types))}
    pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges)]
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    backend.pre_tokenizer = _pre_tokenizer(pre)
    backend.decoder = decoders.ByteLevel()
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    backend.add_special_tokens(control)
    backend.add_tokens(user)  # llama.cpp matches user-defined tokens whole even in plain text
    return backend


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The split that matches how the vocabulary's merges were learned (GPT-2 regex by default)."""
    if pre in _SPLIT_BY_PRE:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_BY_PRE[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_SPLIT_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level
