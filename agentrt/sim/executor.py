"""The simulated executor: the engine core's real code over a priced, scripted model.

`SimExecutor.run` prices the planned batch with a StepCosts model and returns logits rows that
put all the probability on the scripted next token (ScriptBook): greedy and sampled requests,
constraints and speculation (a draft is accepted as far as it matches the script) then take the
real post-processing path. The KV pool is bookkeeping only (one float per slot: page ids,
refcounts, copy-on-write and truncation are the real code), and `SimTier` holds no bytes but
counts the real model's page size against the tier budget and charges each copy's time. The
seconds of each step and copy accumulate until the simulated step loop (agentrt/sim/loop.py)
lets its virtual clock pass them."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from agentrt.engine.clock import LoopClock
from agentrt.engine.core import EngineCore
from agentrt.engine.executor import StepOutput
from agentrt.kv.store import KVStore
from agentrt.kv.tier import HostTier, TierEntry
from agentrt.model.config import ModelConfig
from agentrt.sim.costs import StepCosts
from agentrt.sim.loop import SimSteps
from agentrt.sim.scripts import ScriptBook

_ONE_SLOT = ModelConfig(arch="llama", vocab_size=2, hidden_size=2, intermediate_size=1, num_layers=1,
                        num_heads=1, num_kv_heads=1, head_dim=2)


class SimModel:
    """A model's shape without weights: what the engine core reads of a model (its config and
    KV element type) when a SimExecutor runs the batches."""

    def __init__(self, cfg: ModelConfig, kv_dtype: torch.dtype = torch.float16):
        self.cfg, self.kv_dtype, self.dtype = cfg, kv_dtype, torch.float32


class SimTier(HostTier):
    """HostTier's budget and bookkeeping; copies cost time, not memory. Its entries are sizes
    without bytes: TierEntry over `meta` tensors [1, n_pages, page_bytes / 2] of uint8, so
    n_pages, nbytes and split are the real entry's."""

    def __init__(self, store: KVStore, page_bytes: int, budget_bytes: int, copy_s_per_page: float,
                 charge: Callable[[float], None]):
        # (HostTier.__init__ is not called: it measures copies of real bytes)
        self.store, self.budget, self.page_bytes, self.used = store, int(budget_bytes), page_bytes, 0
        self.local, self._pin = None, False
        self.copy_s_per_page, self._charge = copy_s_per_page, charge

    def save(self, pages: list[int]) -> TierEntry:
        self._charge(len(pages) * self.copy_s_per_page)
        half = (1, len(pages), self.page_bytes // 2)  # (page_bytes is K's and V's: even)
        k, v = (torch.empty(half, dtype=torch.uint8, device="meta") for _ in range(2))
        entry = TierEntry(k, v)
        self.used += entry.nbytes
        return entry

    def load(self, entry: TierEntry, pages: list[int]) -> None:
        self._charge(len(pages) * self.copy_s_per_page)


class SimExecutor:
    simulated = True
    device_tail = False  # (rows are the host's)

    @staticmethod
    def clock() -> LoopClock:
        return LoopClock()

    def __init__(self, model: SimModel, costs: StepCosts, scripts: ScriptBook | None = None):
        self.model, self.costs = model, costs
        # synthetic tokens from a narrow low range: unconstrained rows need only be that wide
        self.scripts = scripts if scripts is not None else ScriptBook((16, min(272, model.cfg.vocab_size)))
        self.pending_s = 0.0  # simulated seconds not yet passed on the clock
        self.busy_s, self.steps = 0.0, 0
        self._outputs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> its script

    def make_steps(self, core: EngineCore) -> SimSteps:
        """The Engine's step loop: a task on the (virtual-time) event loop that passes the
        seconds this executor charges."""
        return SimSteps(core, self)

    def charge(self, seconds: float) -> None:
        self.pending_s += seconds
        self.busy_s += seconds

    def take_pending(self) -> float:
        s, self.pending_s = self.pending_s, 0.0
        return s

    def allocate(self, num_pages: int, page_size: int, num_local: int | None = None) -> KVStore:
        return KVStore.allocate(_ONE_SLOT, num_pages, page_size, torch.float32)  # (no KV: one pool)

    def tier(self, store: KVStore, budget_bytes: int) -> SimTier:
        ps = store.page_size
        page_bytes = KVStore.bytes_per_token(self.model.cfg, self.model.kv_dtype) * ps
        return SimTier(store, page_bytes, budget_bytes, self.costs.copy_s(1, ps), self.charge)

    def run(self, plan: list, chunks: list, store: KVStore, page_size: int) -> StepOutput:
        seconds = self.costs.seconds(chunks)
        self.charge(seconds + self.costs.loop_s)  # (the loop's gap after the step passes too)
        self.steps += 1
        toks = [[self._token(r, len(r.output) + j) for j in range(ch.want_logits)] for (r, _), ch in zip(plan, chunks)]
        # rows as wide as the vocabulary where a constraint masks them, else as the largest token
        # needs (a step of 256 decoders over a 128k vocabulary would allocate 128 MB for nothing)
        wide = any(r.constraint is not None for r, _ in plan)
        width = self.model.cfg.vocab_size if wide else 1 + max((t for ts in toks for t in ts), default=0)
        flat = [t for ts in toks for t in ts]  # one tensor for every row, split per chunk
        block = torch.full((len(flat), width), float("-inf"))
        block[torch.arange(len(flat)), torch.tensor(flat, dtype=torch.long)] = 0.0
        return StepOutput(tuple(block.split([len(ts) for ts in toks])), seconds)

    def _token(self, r, i: int) -> int:
        out = self._outputs.get(r)
        if out is None:
            out = self._outputs[r] = self.scripts.output(r.prompt, r.params.max_tokens)
        if i < len(out):
            return out[i]
        return min(r.stop_ids) if r.stop_ids else (out[-1] if out else 0)  # past the script: stop

    @staticmethod
    def argmax(logits: torch.Tensor) -> torch.Tensor:
        return torch.argmax(logits, dim=-1)
