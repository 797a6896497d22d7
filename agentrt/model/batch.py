"""Building the forward-pass metadata of one flattened varlen batch from plain lists.

One builder for both steps: `write_tokens` writes a batch's per-token fields (ids, positions,
KV slots, each token's sequence and key count, the logits rows, the page table) into given
destination arrays. The eager step's `build_batch` allocates them at the batch's size and adds
what the eager kernels read besides (decode rows, short rows, the sliding-window layers' own
pages); the CUDA-graph step (model/graphs.py::GraphInputs) points them at its static buffer's
host copy, padded to a bucket."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import numpy as np
import torch

from agentrt.errors import ConfigError
from agentrt.kernels.base import SHORT_QUERIES, AttentionMeta, is_short_row
from agentrt.model.staging import HostStaging


@dataclass(frozen=True)
class SeqChunk:
    """One sequence's part of a batch: `tokens` new ids placed at positions start..start+len-1.

    `pages` lists the page ids that hold (or will hold) positions 0 .. start+len-1 in order.
    `want_logits`: how many trailing tokens need logits (1 for prefill end/decode, k+1 when
    verifying k draft tokens, 0 for a prefill chunk that does not end the prompt).
    `adapter` / `adapter_from`: the LoRA its rows at positions >= adapter_from run.
    """

    tokens: list[int]
    start: int
    pages: list[int]
    want_logits: int = 1
    adapter: Any = None  # the LoraAdapter its rows run (adapters/apply.py), None: the base model
    adapter_from: int = 0  # the first position the adapter computes (aLoRA; earlier rows: base)


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMeta
    logits_rows: torch.Tensor  # [L] rows of the batch whose logits are computed
    logits_count: tuple[int, ...]  # per sequence, how many of those rows are its own

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the batch (all int64, built on the host), in a fixed order."""
        return [self.input_ids, self.positions, self.logits_rows, *self.meta.tensors()]

    def with_tensors(self, ts: list[torch.Tensor]) -> "ForwardBatch":
        it = iter(ts)
        ids, pos, rows = next(it), next(it), next(it)
        return replace(self, input_ids=ids, positions=pos, logits_rows=rows, meta=self.meta.with_tensors(it))

    def to(self, device: torch.device | str, staging: "HostStaging | None" = None) -> "ForwardBatch":
        """The batch with every tensor on `device`, in one host -> device copy (through
        `staging`'s pinned buffer when given); the same batch on the host's own CPU."""
        if torch.device(device).type == "cpu" and self.input_ids.device.type == "cpu":
            return self
        return self.with_tensors((staging or HostStaging(device)).move(self.tensors()))


@dataclass(frozen=True)
class TokenFields:
    """Where `write_tokens` writes a batch of B sequences, T tokens and L logits rows: int64
    arrays at least that long (views of a larger buffer allowed; entries past them untouched)."""

    ids: np.ndarray  # [>= T] token ids
    positions: np.ndarray  # [>= T]
    slots: np.ndarray  # [>= T] flat KV slot of each token: page * page_size + offset
    seq: np.ndarray  # [>= T] each token's sequence (its page-table row)
    lens: np.ndarray  # [>= T] each token's keys: its position + 1
    rows: np.ndarray  # [>= L] the batch rows whose logits are computed
    table: np.ndarray  # [>= B, >= W] each sequence's pages (W: its most pages; the rest untouched)

    @classmethod
    def empty(cls, t: int, n_rows: int, b: int, w: int) -> TokenFields:
        """Fresh arrays of exactly a batch's sizes (the page table zero-padded)."""
        def one(n: int) -> np.ndarray:
            return np.empty(n, dtype=np.int64)
        return cls(one(t), one(t), one(t), one(t), one(t), one(n_rows), np.zeros((b, w), dtype=np.int64))


def write_tokens(chunks: list[SeqChunk], page_size: int, out: TokenFields) -> tuple[int, int]:
    """Write the batch's per-token fields into `out`; returns (T tokens, L logits rows)."""
    b = len(chunks)
    q = np.fromiter((len(c.tokens) for c in chunks), np.int64, b)  # [B] new tokens
    start = np.fromiter((c.start for c in chunks), np.int64, b)  # [B] first position
    want = np.fromiter((c.want_logits for c in chunks), np.int64, b)  # [B] logits rows
    n_pages = np.fromiter((len(c.pages) for c in chunks), np.int64, b)  # [B]
    if bool(((start + q + page_size - 1) // page_size > n_pages).any()):
        raise ConfigError("a chunk's pages do not hold its positions (SeqChunk.pages covers 0 .. start+len-1)")
    cu = np.concatenate(([0], np.cumsum(q)))  # [B + 1] each sequence's first batch row
    t, n_rows = int(cu[-1]), int(want.sum())
    seq = np.repeat(np.arange(b), q)  # [T]
    pos = np.arange(t) + np.repeat(start - cu[:-1], q)  # [T]
    first = np.concatenate(([0], np.cumsum(n_pages)[:-1]))  # [B] each sequence's first page entry
    flat = np.fromiter(chain.from_iterable(c.pages for c in chunks), np.int64, int(n_pages.sum()))
    out.table[np.repeat(np.arange(b), n_pages), np.arange(flat.size) - np.repeat(first, n_pages)] = flat
    out.ids[:t] = np.fromiter(chain.from_iterable(c.tokens for c in chunks), np.int64, t)
    out.positions[:t] = pos
    out.slots[:t] = out.table[seq, pos // page_size] * page_size + pos % page_size
    out.seq[:t] = seq
    out.lens[:t] = pos + 1
    wcu = np.concatenate(([0], np.cumsum(want)))  # [B + 1]
    out.rows[:n_rows] = np.repeat(cu[1:] - want - wcu[:-1], want) + np.arange(n_rows)
    return t, n_rows


def build_batch(chunks: list[SeqChunk], page_size: int, local_of: torch.Tensor | None = None,
                short_limit: int | None = SHORT_QUERIES) -> ForwardBatch:
    """The eager step's batch, on the host. `local_of`: the host copy of the store's logical ->
    local page map when sliding-window layers keep their own pages (kv/store.py::PageMap.host;
    meta.local then holds their page table and slots). `short_limit`: rows of up to this many
    new tokens are attended token by token (None: every row, the GPU's batch-invariant mode:
    DecoderModel.short_limit)."""
    f = TokenFields.empty(sum(len(c.tokens) for c in chunks), sum(c.want_logits for c in chunks),
                          len(chunks), max(len(c.pages) for c in chunks))
    write_tokens(chunks, page_size, f)
    q_lens = tuple(len(c.tokens) for c in chunks)
    kv_lens = tuple(c.start + len(c.tokens) for c in chunks)
    cu = (0, *np.cumsum(q_lens).tolist())
    short = np.fromiter((is_short_row(q, short_limit) for q in q_lens), bool, len(chunks))  # [B]
    tok = np.flatnonzero(short[f.seq])  # [Ts] the tokens of short rows
    decode = tuple(i for i, q in enumerate(q_lens) if q == 1)
    t = torch.from_numpy
    meta = AttentionMeta(
        q_lens=q_lens, kv_lens=kv_lens, cu_q=cu, page_table=t(f.table), slot_mapping=t(f.slots),
        kv_lens_t=torch.tensor(kv_lens, dtype=torch.long), decode_rows=decode,
        prefill_rows=tuple(i for i, q in enumerate(q_lens) if q > 1), page_size=page_size,
        decode_idx=torch.tensor(decode, dtype=torch.long), decode_tok=torch.tensor([cu[r] for r in decode], dtype=torch.long),
        decode_lens=torch.tensor([kv_lens[r] for r in decode], dtype=torch.long),
        decode_max_kv=max((kv_lens[r] for r in decode), default=0), short_tok=t(tok), short_seq=t(f.seq[tok]),
        short_lens=t(f.lens[tok]), short_max_kv=int(f.lens[tok].max(initial=0)),
        long_rows=tuple(i for i in range(len(chunks)) if not short[i]))
    if local_of is not None:
        meta = replace(meta, local=_local(meta, local_of, page_size))
    return ForwardBatch(t(f.ids), t(f.positions), meta, t(f.rows), tuple(c.want_logits for c in chunks))


def _local(meta: AttentionMeta, local_of: torch.Tensor, page_size: int) -> AttentionMeta:
    """The batch over the sliding-window layers' own rows (a released page maps to row 0: no
    window reaches it)."""
    slots = meta.slot_mapping
    local_slots = local_of[slots // page_size] * page_size + slots % page_size  # [T]
    if bool((local_slots < 0).any()):
        raise RuntimeError("a token is written to a page whose sliding-window KV was released")
    return replace(meta, page_table=local_of[meta.page_table].clamp(min=0), slot_mapping=local_slots)
