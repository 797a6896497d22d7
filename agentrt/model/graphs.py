"""CUDA graphs of short steps: one graph per token bucket (1, 2, 4 ... 512) over static buffers.

On a GPU a step of a small model costs launches, not FLOPs (an eager step of a 1B model launches
~20 kernels a layer). A short step - every row a few new tokens (decode, draft verification,
fast-forwarded grammar runs, tool results: rows of up to SHORT_QUERIES tokens; rows of any length
in the batch-invariant mode), attended token by token (kernels/triton_attention.py) - is the same
computation for every batch of T tokens up to its inputs, so it is captured once per bucket of T
and replayed.

Static inputs, one flat int64 device buffer per executor (bucket b reads its prefix):

    [ ids b | positions b | slots b | seq b | kv_lens b | logits rows b | page_table b x W ]

seq: each token's sequence (its page-table row); kv_lens: its position + 1; W: max pages of a
sequence. Each step fills that prefix on the host (a pinned buffer) and copies it in ONE host ->
device copy; the replay writes the logits of the first L rows listed (L: the rows the step wants);
the caller reads back only those (the step's one sync). Tokens past the step's are padding: token 0
at position 0, one key, its sequence's page table row pointing at the store's scratch page (a page
past the allocator's pool), so they write and read only there.

Graphs read the KV store's tensors by address: `key()` names the store they were captured over,
and the executor captures again when the pool changes (a resized or new store).
Prefill and mixed steps run eagerly (their shapes change every step)."""

from __future__ import annotations

import numpy as np
import torch

from agentrt.kernels.base import SHORT_QUERIES, AttentionMeta
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
FIELDS = 6  # ids, positions, slots, seq, kv_lens, logits rows


def graphable(model, store: KVStore) -> bool:
    """Whether `model`'s short steps over `store` can be captured: a CUDA model on the triton
    backend, one page pool (sliding-window layers with pages of their own index a second table),
    dense MLPs (a mixture of experts routes on the host) and a float KV store."""
    return (model.device.type == "cuda" and model.ops.name == "triton"
            and store.local_of is None and store.k[0].dtype != torch.int8 and not model.cfg.is_moe)


def is_short(chunks: list[SeqChunk], short_limit: int | None = SHORT_QUERIES) -> bool:
    """Every row at most `short_limit` new tokens (None: any, the batch-invariant mode, whose
    eager steps attend every row token by token too: DecoderModel.short_limit), at most the
    largest bucket of tokens."""
    limit = BUCKETS[-1] if short_limit is None else short_limit
    return (0 < len(chunks) and sum(len(c.tokens) for c in chunks) <= BUCKETS[-1]
            and all(0 < len(c.tokens) <= limit and c.want_logits <= len(c.tokens) for c in chunks))


def bucket_of(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


class StepGraphs:
    """The captured short steps of one model over one KV store (`scratch`: a page of the store
    the allocator never hands out)."""

    def __init__(self, model, store: KVStore, scratch: int):
        self.model, self.store, self.scratch = model, store, scratch
        self.page_size = store.page_size
        ctx_pages = -(-model.cfg.max_position_embeddings // self.page_size)
        self.width = min(scratch, ctx_pages)  # W: pages one sequence can hold
        per = FIELDS + self.width
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
        """ids, positions, slots, seq, lens, logits rows [b] and page table [b, W]: views of `flat`."""
        f = self.flat[: b * (FIELDS + self.width)]
        return (*f[: FIELDS * b].view(FIELDS, b).unbind(0), f[FIELDS * b:].view(b, self.width))

    def _fill(self, chunks: list[SeqChunk], b: int) -> int:
        """Pack the step (padded to b tokens) into the pinned buffer and copy it to `flat`;
        returns the number of logits rows."""
        if self.copied is not None:
            self.copied.synchronize()  # (the previous step's copy has left the buffer)
        ps, w = self.page_size, self.width
        h = self.host_np[: b * (FIELDS + w)]
        vec, table = h[: FIELDS * b].reshape(FIELDS, b), h[FIELDS * b:].reshape(b, w)
        n = rows = 0
        for i, c in enumerate(chunks):
            k = len(c.tokens)
            pos = np.arange(c.start, c.start + k)
            pages = np.asarray(c.pages, dtype=np.int64)
            vec[0, n:n + k] = c.tokens
            vec[1, n:n + k] = pos
            vec[2, n:n + k] = pages[pos // ps] * ps + pos % ps
            vec[3, n:n + k] = i
            vec[4, n:n + k] = pos + 1
            vec[5, rows:rows + c.want_logits] = np.arange(n + k - c.want_logits, n + k)
            table[i, : len(c.pages)] = pages
            n, rows = n + k, rows + c.want_logits
        pad = len(chunks)  # (the padding tokens' sequence: a row whose table is the scratch page)
        vec[:, n:] = ((0,), (0,), (self.scratch * ps,), (pad,), (1,), (0,))
        vec[5, rows:] = 0
        if pad < b:
            table[pad, 0] = self.scratch
        self.flat[: b * (FIELDS + w)].copy_(self.host[: b * (FIELDS + w)], non_blocking=True)
        self.copied = torch.cuda.Event()
        self.copied.record()
        return rows

    def _meta(self, b: int) -> tuple[AttentionMeta, tuple]:
        ids, pos, slots, seq, lens, rows, table = self._views(b)
        none = self.arange[:0]
        meta = AttentionMeta(
            q_lens=(1,) * b, kv_lens=(1,) * b, cu_q=tuple(range(b + 1)), page_table=table, slot_mapping=slots,
            kv_lens_t=lens, decode_rows=(), prefill_rows=(), page_size=self.page_size, decode_idx=none,
            decode_tok=none, decode_lens=none, decode_max_kv=0, short_tok=self.arange[:b], short_seq=seq,
            short_lens=lens, short_max_kv=self.width * self.page_size, long_rows=())
        return meta, (ids, pos, rows)

    def _capture(self, b: int) -> None:
        meta, (ids, pos, rows) = self._meta(b)
        self._fill([], b)  # every token padding: warm-up and capture write only the scratch page
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
        """Logits [L, V] of a short step (each chunk's last want_logits rows, in order), on the
        device (not synchronized)."""
        b = bucket_of(sum(len(c.tokens) for c in chunks))
        if b not in self.graphs:
            self._capture(b)
        rows = self._fill(chunks, b)
        g, out = self.graphs[b]
        g.replay()
        self.replays += 1
        return out[:rows]
