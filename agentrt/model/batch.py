"""Building the forward-pass metadata of one flattened varlen batch from plain lists."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from agentrt.kernels.base import SHORT_QUERIES, AttentionMeta
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


def _short_rows(q_lens: list[int], kv_lens: list[int], cu: list[int], limit: int | None) -> dict:
    """The token-by-token fields of AttentionMeta (rows of up to `limit` new tokens; None: all)."""
    limit = limit if limit is not None else max(q_lens, default=0)
    short = [i for i, q in enumerate(q_lens) if q <= limit]
    tok = [x for i in short for x in range(cu[i], cu[i + 1])]
    lens = [kv_lens[i] - q_lens[i] + 1 + j for i in short for j in range(q_lens[i])]
    return dict(short_tok=torch.tensor(tok, dtype=torch.long),
                short_seq=torch.tensor([i for i in short for _ in range(q_lens[i])], dtype=torch.long),
                short_lens=torch.tensor(lens, dtype=torch.long), short_max_kv=max(lens, default=0),
                long_rows=tuple(i for i, q in enumerate(q_lens) if q > limit))


def build_batch(chunks: list[SeqChunk], page_size: int, local_of: torch.Tensor | None = None,
                short_limit: int | None = SHORT_QUERIES) -> ForwardBatch:
    """`local_of`: the store's logical -> local page map when sliding-window layers keep their
    own pages (meta.local then holds their page table and slots). `short_limit`: rows of up to
    this many new tokens are attended token by token (None: every row, the GPU's batch-invariant
    mode: DecoderModel.short_limit)."""
    ids, pos, slots, rows, counts = [], [], [], [], []
    q_lens, kv_lens, cu = [], [], [0]
    for c in chunks:
        n = len(c.tokens)
        ids.extend(c.tokens)
        p = list(range(c.start, c.start + n))
        pos.extend(p)
        slots.extend(c.pages[x // page_size] * page_size + x % page_size for x in p)
        rows.extend(range(cu[-1] + n - c.want_logits, cu[-1] + n))
        counts.append(c.want_logits)
        q_lens.append(n)
        kv_lens.append(c.start + n)
        cu.append(cu[-1] + n)
    width = max(len(c.pages) for c in chunks)
    table = torch.tensor([list(c.pages) + [0] * (width - len(c.pages)) for c in chunks], dtype=torch.long)
    decode = tuple(i for i, q in enumerate(q_lens) if q == 1)
    slot_t = torch.tensor(slots, dtype=torch.long)
    meta = AttentionMeta(
        q_lens=tuple(q_lens), kv_lens=tuple(kv_lens), cu_q=tuple(cu), page_table=table,
        slot_mapping=slot_t, kv_lens_t=torch.tensor(kv_lens, dtype=torch.long), decode_rows=decode,
        prefill_rows=tuple(i for i, q in enumerate(q_lens) if q > 1), page_size=page_size,
        decode_idx=torch.tensor(decode, dtype=torch.long), decode_tok=torch.tensor([cu[r] for r in decode], dtype=torch.long),
        decode_lens=torch.tensor([kv_lens[r] for r in decode], dtype=torch.long),
        decode_max_kv=max((kv_lens[r] for r in decode), default=0), **_short_rows(q_lens, kv_lens, cu, short_limit),
    )
    if local_of is not None:  # (a released page maps to row 0: no window reaches it)
        local_slots = local_of[slot_t // page_size] * page_size + slot_t % page_size
        if bool((local_slots < 0).any()):
            raise RuntimeError("a token is written to a page whose sliding-window KV was released")
        meta = replace(meta, local=replace(meta, page_table=local_of[table].clamp(min=0), slot_mapping=local_slots))
    return ForwardBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(pos, dtype=torch.long),
                        meta, torch.tensor(rows, dtype=torch.long), tuple(counts))
