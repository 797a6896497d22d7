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
sequence. `GraphInputs` fills that prefix with the eager step's own builder
(model/batch.py::write_tokens) in the executor's staging buffer (model/staging.py) and copies it
in ONE host -> device copy; the replay writes the logits of the first L rows listed (L: the rows
the step wants); the caller reads back only those (the step's one sync). Tokens past the step's
are padding: token 0 at position 0, one key, its sequence's page table row pointing at the
store's scratch page (a page past the allocator's pool), so they write and read only there.

Graphs read the KV store's tensors by address: `key()` names the store they were captured over,
and the executor captures again when the pool changes (a resized or new store).
Prefill and mixed steps run eagerly (their shapes change every step)."""

from __future__ import annotations

import torch

from agentrt.kernels.base import SHORT_QUERIES, AttentionMeta, is_short_row
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, TokenFields, write_tokens
from agentrt.model.staging import HostStaging

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
    return (0 < len(chunks) and sum(len(c.tokens) for c in chunks) <= BUCKETS[-1]
            and all(0 < len(c.tokens) and is_short_row(len(c.tokens), short_limit)
                    and c.want_logits <= len(c.tokens) for c in chunks))


def bucket_of(n: int) -> int:
    return next(b for b in BUCKETS if b >= n)


class GraphInputs:
    """The captured steps' static inputs: `flat` on the device (the layout above) and the
    metadata views of its bucket prefixes. `width`: W; `scratch`: the padding rows' page."""

    def __init__(self, device: torch.device, page_size: int, width: int, scratch: int,
                 staging: HostStaging | None = None):
        self.page_size, self.width, self.scratch = page_size, width, scratch
        self.staging = staging if staging is not None else HostStaging(device)
        self.flat = torch.zeros(BUCKETS[-1] * (FIELDS + width), dtype=torch.int64, device=device)
        self.arange = torch.arange(BUCKETS[-1], dtype=torch.int64, device=device)

    def size(self, b: int) -> int:
        return b * (FIELDS + self.width)

    def views(self, b: int) -> tuple[torch.Tensor, ...]:
        """ids, positions, slots, seq, lens, logits rows [b] and page table [b, W]: views of `flat`."""
        f = self.flat[: self.size(b)]
        return (*f[: FIELDS * b].view(FIELDS, b).unbind(0), f[FIELDS * b:].view(b, self.width))

    def fill(self, chunks: list[SeqChunk], b: int) -> int:
        """Write the step (padded to b tokens) into the staging buffer and copy it into `flat`;
        returns the number of logits rows."""
        h = self.staging.host(self.size(b)).numpy()
        vec, table = h[: FIELDS * b].reshape(FIELDS, b), h[FIELDS * b:].reshape(b, self.width)
        ids, pos, slots, seq, lens, logits_rows = vec  # (the layout's [b] fields, in order)
        n, rows = write_tokens(chunks, self.page_size, TokenFields(ids, pos, slots, seq, lens, logits_rows, table))
        pad = len(chunks)  # (the padding tokens' sequence: a row whose table is the scratch page)
        vec[:, n:] = ((0,), (0,), (self.scratch * self.page_size,), (pad,), (1,), (0,))
        vec[5, rows:] = 0
        if pad < b:
            table[pad, 0] = self.scratch
        self.staging.send(self.flat[: self.size(b)])
        return rows

    def meta(self, b: int) -> tuple[AttentionMeta, tuple[torch.Tensor, ...]]:
        """The metadata of bucket b over `flat` (every token a short row of its own sequence
        row), and the ids, positions and logits rows it runs."""
        ids, pos, slots, seq, lens, rows, table = self.views(b)
        none = self.arange[:0]
        meta = AttentionMeta(
            q_lens=(1,) * b, kv_lens=(1,) * b, cu_q=tuple(range(b + 1)), page_table=table, slot_mapping=slots,
            kv_lens_t=lens, decode_rows=(), prefill_rows=(), page_size=self.page_size, decode_idx=none,
            decode_tok=none, decode_lens=none, decode_max_kv=0, short_tok=self.arange[:b], short_seq=seq,
            short_lens=lens, short_max_kv=self.width * self.page_size, long_rows=())
        return meta, (ids, pos, rows)


class StepGraphs:
    """The captured short steps of one model over one KV store (`scratch`: a page of the store
    the allocator never hands out; `staging`: the executor's host buffer)."""

    def __init__(self, model, store: KVStore, scratch: int, staging: HostStaging | None = None):
        self.model, self.store = model, store
        ctx_pages = -(-model.cfg.max_position_embeddings // store.page_size)
        # W: pages one sequence can hold
        self.inputs = GraphInputs(model.device, store.page_size, min(scratch, ctx_pages), scratch, staging)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.replays = 0

    @staticmethod
    def key(store: KVStore) -> tuple:
        return (store.k[0].data_ptr(), store.k[0].shape, len(store.k))

    def matches(self, store: KVStore) -> bool:
        return self.key(store) == self.key(self.store)

    def _capture(self, b: int) -> None:
        meta, (ids, pos, rows) = self.inputs.meta(b)
        self.inputs.fill([], b)  # every token padding: warm-up and capture write only the scratch page
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
        rows = self.inputs.fill(chunks, b)
        g, out = self.graphs[b]
        g.replay()
        self.replays += 1
        return out[:rows]
