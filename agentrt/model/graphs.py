"""CUDA graphs of the decode step: one graph per batch bucket (1, 2, 4 ... 64) over static buffers.

On a GPU a decode step of a small model costs launches, not FLOPs (an eager step of a 1B model
launches ~20 kernels a layer). A decode step (every row one new token, one logits row each) is
the same computation every time up to its inputs, so it is captured once per bucket and replayed.

Static inputs, one flat int64 device buffer per executor (bucket b reads its prefix):

    [ ids b | positions b | slots b | kv_lens b | page_table b x W ]     W = max pages of a sequence

Each step fills that prefix on the host (a pinned buffer) and copies it in ONE host -> device copy;
the replay writes the logits [b, V]; the caller reads back only its rows (the step's one sync).
Rows past the step's batch are padding: token 0 at position 0, one key, its page table pointing at
the store's scratch page (a page past the allocator's pool), so they write and read only there.

Graphs read the KV store's tensors by address: `key()` names the store they were captured over,
and `DecodeGraphs.for_store` recaptures when the pool changes (a resized or new store).
Prefill and mixed steps run eagerly (their shapes change every step)."""

from __future__ import annotations

import numpy as np
import torch

from agentrt.kernels.base import AttentionMeta
from agentrt.model.batch import SeqChunk
from agentrt.model.kv import KVStore

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def graphable(model, store: KVStore) -> bool:
    """Whether `model`'s decode step over `store` can be captured: a CUDA model on the triton
    backend, full-attention layers (no window, no softcap: the triton decode kernel has
    neither), dense MLPs (a mixture of experts routes on the host) and a float KV store."""
    cfg = model.cfg
    return (model.device.type == "cuda" and getattr(model.ops, "name", "") == "triton"
            and store.local_of is None and store.k[0].dtype != torch.int8 and not cfg.is_moe
            and not cfg.attn_softcap and not any(cfg.window(i) for i in range(cfg.num_layers)))


def is_decode(chunks: list[SeqChunk]) -> bool:
    """Every row one new token with one logits row, at most the largest bucket of them."""
    return 0 < len(chunks) <= BUCKETS[-1] and all(len(c.tokens) == 1 and c.want_logits == 1 for c in chunks)


def bucket_of(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


class DecodeGraphs:
    """The captured decode steps of one model over one KV store (`scratch`: a page of the store
    the allocator never hands out)."""

    def __init__(self, model, store: KVStore, scratch: int):
        self.model, self.store, self.scratch = model, store, scratch
        self.page_size = store.page_size
        ctx_pages = -(-model.cfg.max_position_embeddings // self.page_size)
        self.width = min(scratch, ctx_pages)  # W: pages one sequence can hold
        per = 4 + self.width
        dev = model.device
        self.flat = torch.zeros(BUCKETS[-1] * per, dtype=torch.int64, device=dev)
        self.host = torch.zeros(BUCKETS[-1] * per, dtype=torch.int64, pin_memory=True)
        self.host_np = self.host.numpy()
        self.copied: torch.cuda.Event | None = None
        self.arange = torch.arange(BUCKETS[-1], dtype=torch.int64, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.replays = 0

    @staticmethod
    def key(store: KVStore) -> tuple:
        return (store.k[0].data_ptr(), store.k[0].shape, len(store.k))

    def matches(self, store: KVStore) -> bool:
        return self.key(store) == self.key(self.store)

    def _views(self, b: int):
        """ids, positions, slots, lens [b] and page table [b, W]: prefix views of `flat`."""
        f = self.flat[: b * (4 + self.width)]
        return (*f[: 4 * b].view(4, b).unbind(0), f[4 * b:].view(b, self.width))

    def _fill(self, chunks: list[SeqChunk], b: int) -> None:
        """Pack the step (padded to b rows) into the pinned buffer and copy it to `flat`."""
        if self.copied is not None:
            self.copied.synchronize()  # (the previous step's copy has left the buffer)
        n, ps, w = len(chunks), self.page_size, self.width
        h = self.host_np[: b * (4 + w)]
        vec, table = h[: 4 * b].reshape(4, b), h[4 * b:].reshape(b, w)
        vec[0, :n] = [c.tokens[0] for c in chunks]
        vec[1, :n] = [c.start for c in chunks]
        vec[2, :n] = [c.pages[c.start // ps] * ps + c.start % ps for c in chunks]
        vec[3, :n] = [c.start + 1 for c in chunks]
        vec[:, n:] = ((0,), (0,), (self.scratch * ps,), (1,))
        table[:, 0] = self.scratch
        for i, c in enumerate(chunks):
            table[i, : len(c.pages)] = c.pages
        self.flat[: b * (4 + w)].copy_(self.host[: b * (4 + w)], non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()

    def _meta(self, b: int) -> tuple[AttentionMeta, tuple]:
        ids, pos, slots, lens, table = self._views(b)
        rows = self.arange[:b]
        meta = AttentionMeta(
            q_lens=(1,) * b, kv_lens=(1,) * b, cu_q=tuple(range(b + 1)), page_table=table, slot_mapping=slots,
            kv_lens_t=lens, decode_rows=tuple(range(b)), prefill_rows=(), page_size=self.page_size,
            decode_idx=rows, decode_tok=rows, decode_lens=lens, decode_max_kv=0, short_tok=rows, short_seq=rows,
            short_lens=lens, short_max_kv=self.width * self.page_size, long_rows=())
        return meta, (ids, pos, rows)

    def _capture(self, b: int) -> None:
        meta, (ids, pos, rows) = self._meta(b)
        self._fill([], b)  # every row padding: warm-up and capture write only the scratch page
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # (triton compiles and autotunes outside the capture)
                self.model(ids, pos, self.store, meta, rows, path="eager")
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model(ids, pos, self.store, meta, rows, path="eager")
        self.graphs[b] = (g, out)

    def capture_all(self, buckets=BUCKETS) -> None:
        """Capture the given buckets now, largest first (they share one memory pool)."""
        for b in sorted(buckets, reverse=True):
            if b not in self.graphs:
                self._capture(b)

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        """Logits [len(chunks), V] of a decode step, on the device (not synchronized)."""
        b = bucket_of(len(chunks))
        if b not in self.graphs:
            self._capture(b)
        self._fill(chunks, b)
        g, out = self.graphs[b]
        g.replay()
        self.replays += 1
        return out[: len(chunks)]
