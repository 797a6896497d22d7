"""The engine core's executor: what runs a planned batch and owns the KV storage it writes.

`EngineCore.step` plans a batch (the scheduler), hands its chunks to the executor, and
post-processes the logits rows that come back (verification, constraints, sampling, stops).
`ModelExecutor` runs the model; `agentrt.sim.SimExecutor` prices the same batch with a cost model
and returns rows that replay scripted tokens, so admission, scheduling, caching, eviction, the
tier, retention, prefetch and preemption are the same code either way."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
import torch

from agentrt.adapters.apply import LoraStep
from agentrt.engine.clock import Clock
from agentrt.kv.store import KVStore
from agentrt.kv.tier import HostTier
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.graphs import StepGraphs, graphable, is_short
from agentrt.model.staging import HostStaging

log = structlog.get_logger("agentrt.engine")


@dataclass(frozen=True)
class StepOutput:
    """rows[i]: logits [k, V] of chunk i's rows that want logits; seconds: the step's cost when
    the executor knows it (simulated), None when the core should time it (real)."""

    rows: tuple[torch.Tensor, ...]
    seconds: float | None = None


class Executor(Protocol):
    simulated: bool
    # True: run() leaves the logits rows on the model's device and the core decides there
    # (engine/device_tail.py); False: rows come back to the host
    device_tail: bool

    @property
    def make_steps(self) -> Callable[[Any], Any] | None:
        """The Engine's step loop, make_steps(core) (None: its own StepThread, engine/loop.py)."""

    def clock(self) -> Clock | None:
        """The clock every "now" of the core reads (None: the wall clock)."""

    def allocate(self, num_pages: int, page_size: int, num_local: int | None = None) -> KVStore:
        """The KV pool's storage (once, at start); `num_local`: pages of the sliding-window
        layers' own pool (kv/window.py), None for one pool."""

    def tier(self, store: KVStore, budget_bytes: int) -> HostTier:
        """The second KV tier over `store`."""

    def run(self, plan: list, chunks: list[SeqChunk], store: KVStore, page_size: int) -> StepOutput:
        """Run one batch over `store`: plan[i] = (request, tokens), chunks[i] its forward chunk."""

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Row-wise argmax (greedy sampling and draft verification)."""


class ModelExecutor:
    """The real executor: the model's forward over a paged KV store, on the model's device. The
    KV pool lives there; each batch is built on the host and moved there in one copy (a pinned
    buffer: model/staging.py). On the CPU the logits rows are the host's; on a GPU they stay on
    the device (`device_tail`, the default there): masks, sampling and greedy verification run
    there and only ids come back (engine/device_tail.py; device_tail=False ships the rows to the
    host and decides there, as the CPU does). On a GPU, decode
    steps of short rows (decode, verification, fast-forward, tool results) replay CUDA graphs
    (model/graphs.py, one per token bucket) where the model allows them; steps with a long
    prefill row run eagerly."""

    simulated = False
    make_steps = None  # (the Engine's own StepThread)

    @staticmethod
    def clock() -> Clock | None:
        return None  # (the wall clock)

    def __init__(self, model, path: str | None = None, cuda_graphs: bool = True, device_tail: bool | None = None):
        self.model, self.path = model, path  # path None: the model's own default forward
        self.device = model.device
        self.device_tail = self.device.type == "cuda" if device_tail is None else device_tail
        self.staging = HostStaging(self.device)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.graphs: StepGraphs | None = None
        self.steps = {"graph": 0, "eager": 0}  # steps run each way, and their seconds (host + device)
        self.seconds = {"graph": 0.0, "eager": 0.0}

    def allocate(self, num_pages: int, page_size: int, num_local: int | None = None) -> KVStore:
        # on a GPU, one page past the allocator's pool: the scratch page that graph padding rows use
        extra = 1 if self.cuda_graphs else 0
        return KVStore.allocate(self.model.cfg, num_pages + extra, page_size, self.model.kv_dtype,
                                device=self.device, num_local=num_local)

    def tier(self, store: KVStore, budget_bytes: int) -> HostTier:
        return HostTier(store, budget_bytes)

    def _graphs(self, store: KVStore) -> StepGraphs | None:
        if not (self.cuda_graphs and graphable(self.model, store)):
            return None
        if self.graphs is None or not self.graphs.matches(store):  # (a new pool: capture again)
            self.graphs = StepGraphs(self.model, store, scratch=store.num_pages - 1, staging=self.staging)
        return self.graphs

    def run(self, plan: list, chunks: list[SeqChunk], store: KVStore, page_size: int) -> StepOutput:
        t0 = time.perf_counter()
        lora = LoraStep.of(chunks)  # (rows of LoRA adapters: eager, not in a graph)
        graphs = self._graphs(store) if lora is None and is_short(chunks, self.model.short_limit) else None
        logits = self._replay(graphs, chunks) if graphs is not None else None
        if logits is not None:
            kind, rows = "graph", tuple(self._rows(logits).split([c.want_logits for c in chunks]))
        else:
            fb = build_batch(chunks, page_size, store.local_host, self.model.short_limit).to(self.device, self.staging)
            extra = {} if lora is None else {"lora": lora}
            logits = self.model(fb.input_ids, fb.positions, store, fb.meta, fb.logits_rows, path=self.path, **extra)
            kind, rows = "eager", tuple(self._rows(logits).split(list(fb.logits_count)))
        self.steps[kind] += 1
        self.seconds[kind] += time.perf_counter() - t0
        return StepOutput(rows)

    def _rows(self, logits: torch.Tensor) -> torch.Tensor:
        """The step's logits where the core reads them: on the device with `device_tail` (a
        graph's rows are its static output: read before the next replay, as the core does)."""
        return logits if self.device_tail else logits.cpu()

    def _replay(self, graphs: StepGraphs, chunks: list[SeqChunk]) -> torch.Tensor | None:
        """The step's logits from its graph; None (and eager from now on) when the first
        capture fails: the model holds an op that cannot be captured (a host sync, say)."""
        try:
            return graphs.run(chunks)
        except RuntimeError as exc:
            if graphs.replays:  # (a replayed graph failing is a device fault, not a capture limit)
                raise
            log.warning("cuda_graphs.disabled", reason=f"{type(exc).__name__}: {exc}"[:300])
            self.cuda_graphs, self.graphs = False, None
            return None

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        # (the rows are on the host: a GPU model's own argmax kernel does not take them)
        return self.model.ops.argmax(logits) if self.device.type == "cpu" else logits.argmax(-1)
