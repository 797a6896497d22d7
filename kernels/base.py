"""The kernel interface the model calls; implementations: reference.TorchBackend, triton_ops."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

SHORT_QUERIES = 64  # rows of up to this many new tokens are attended token by token on a GPU


def is_short_row(q_len: int, limit: int | None = SHORT_QUERIES) -> bool:
    """The one definition of a short row: at most `limit` new tokens (None: every row, the
    batch-invariant mode's, DecoderModel.short_limit). Short rows are attended token by token
    (kernels/triton_attention.py, the CPU kernels' vector attention); the others row by row."""
    return limit is None or q_len <= limit


@dataclass(frozen=True)
class AttentionMeta:
    """Forward-pass metadata of one flattened varlen batch (B sequences, T new tokens).

    Sequence b contributes q_lens[b] new tokens, which sit at positions
    kv_lens[b] - q_lens[b] ... kv_lens[b] - 1 of its KV; kv_lens[b] counts the KV after this
    step's tokens are stored. Tokens of sequence b occupy rows cu_q[b]:cu_q[b+1] of the batch.

        page_table: [B, max_pages] int64, page ids of each sequence in order (padded with 0)
        slot_mapping: [T] int64, flat KV slot (page * page_size + offset) of each new token
        decode_rows: sequence indices with q_len == 1 (batched together), on the host
        prefill_rows: sequence indices with q_len > 1 (attended one by one), on the host
        decode_idx: [Bd] int64, decode_rows as a tensor (rows of page_table and kv_lens_t)
        decode_tok: [Bd] int64, the batch row of each decode token
        decode_lens: [Bd] int64, the KV length of each decode row (kv_lens_t[decode_idx])
        decode_max_kv: the longest decode KV (a host int: shapes never need a device read)
        short_tok: [Ts] int64, the batch rows of every token of a short row (q_len <=
            SHORT_QUERIES: decode, verification, fast-forward, small chunks), attended token by
            token (kernels/triton_attention.py); long_rows: the other rows (host), one by one
        short_seq: [Ts] int64, each such token's sequence (its page_table row)
        short_lens: [Ts] int64, each such token's keys: its position + 1
        short_max_kv: the longest of those (a host int)

    Complete when built (model/batch.py builds every field on the host); `to()` moves every
    tensor, so nothing a kernel reads is made after the batch reaches the model's device.
    """

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    cu_q: tuple[int, ...]
    page_table: torch.Tensor
    slot_mapping: torch.Tensor
    kv_lens_t: torch.Tensor  # [B] int64, kv_lens as a tensor
    decode_rows: tuple[int, ...]
    prefill_rows: tuple[int, ...]
    page_size: int
    decode_idx: torch.Tensor
    decode_tok: torch.Tensor
    decode_lens: torch.Tensor
    decode_max_kv: int
    short_tok: torch.Tensor
    short_seq: torch.Tensor
    short_lens: torch.Tensor
    short_max_kv: int
    long_rows: tuple[int, ...]
    # the same batch over the sliding-window layers' own pages (kv/window.py), where the store
    # keeps them apart: page_table and slot_mapping in local rows; None otherwise
    local: "AttentionMeta | None" = None

    TENSORS = ("page_table", "slot_mapping", "kv_lens_t", "decode_idx", "decode_tok", "decode_lens", "short_tok",
               "short_seq", "short_lens")

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the metadata in a fixed order; of the local view only its own two
        (it shares the rest with the batch: model/batch.py builds it by `replace`)."""
        own = [getattr(self, n) for n in self.TENSORS]
        return own + ([self.local.page_table, self.local.slot_mapping] if self.local is not None else [])

    def with_tensors(self, ts) -> "AttentionMeta":
        """The same metadata over `ts` (an iterator in `tensors()` order, e.g. moved copies)."""
        own = {n: next(ts) for n in self.TENSORS}
        local = None if self.local is None else \
            replace(self.local, **{**own, "page_table": next(ts), "slot_mapping": next(ts)})
        return replace(self, **own, local=local)

    def to(self, device: torch.device | str) -> "AttentionMeta":
        """The same metadata with its tensors on `device` (a GPU model's batch)."""
        return self.with_tensors(iter([t.to(device) for t in self.tensors()]))

    def for_layer(self, local: bool) -> "AttentionMeta":
        """The metadata a layer reads (a sliding-window layer's, where they have their own)."""
        return self.local if local and self.local is not None else self

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    @property
    def num_tokens(self) -> int:
        return self.cu_q[-1]


class KernelBackend(Protocol):
    name: str
    # > 0: the batch-invariant mode's keys per attention split (kernels/triton_attention.py);
    # a batch for it is built with every row attended token by token (DecoderModel.short_limit)
    invariant_chunk: int

    def store_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write k, v [T, Hkv, D] into caches [P, page_size, Hkv, D] at slot_mapping [T]."""

    def paged_attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMeta, scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
        """Causal attention of q [T, H, D] over each sequence's pages; returns [T, H, D].
        window > 0: a query attends only its last `window` keys (sliding window); softcap > 0:
        scores become softcap * tanh(scores / softcap) (Gemma 2)."""

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy token ids [B] of logits [B, V], on the logits' device (no host sync)."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dim, computed in fp32, returned in x's dtype."""

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding (rotate-half layout) of x [T, H, D] with cos/sin [T, D]."""
