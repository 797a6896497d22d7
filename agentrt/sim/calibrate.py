"""Calibration: this machine's step cost model, fitted to real engine steps.

Real EngineCore steps (the model's forward plus everything the step does around it: planning,
batch metadata, sampling, bookkeeping) are timed over batches of chosen shapes -- decode steps
of 1-16 sequences at short and long contexts, prefill chunks of 32-2048 tokens, chunks after a
cached prefix -- and StepCosts.fit finds the non-negative coefficients. The tier's copy cost is
HostTier's own measurement. `agentrt bench calibrate` writes the result as JSON."""

from __future__ import annotations

import statistics
import time

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.executor import ModelExecutor
from agentrt.sampling import SamplingParams
from agentrt.sim.costs import StepCosts


class _Timed(ModelExecutor):
    """The real executor, remembering the shape of the batch it ran last."""

    def run(self, plan, chunks, store, page_size):
        self.last = [(c.start, len(c.tokens)) for c in chunks]
        return super().run(plan, chunks, store, page_size)


def _steps(core: EngineCore, ex: _Timed, out: list, skip: int = 1) -> None:
    """Step until idle, keeping (batch shape, step seconds) of every step after the first `skip`."""
    i = 0
    while core.has_work():
        t0 = time.perf_counter()
        core.step()
        dt = time.perf_counter() - t0
        if i >= skip:
            out.append((ex.last, dt))
        i += 1


def _submit(core: EngineCore, prompt: list[int], max_tokens: int, session=None):
    seq_id = None if session is not None else core.pool.acquire("transient", 0)
    return core.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), lambda ev: None,
                            seq_id=seq_id, session=session)


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % (vocab - 10) + 5 for i in range(n)]


def samples(model, quick: bool = False) -> list[tuple[list, float]]:
    """(batch shape, seconds) of real steps over a grid of decode and prefill shapes."""
    vocab, ctx_max = model.cfg.vocab_size, model.cfg.max_position_embeddings
    ex = _Timed(model)
    cfg = EngineConfig(kv_cache_tokens=65536, response_cache_size=0, enable_speculation=False,
                       enable_radix_cache=False, chunk_min=16, chunk_max=4096, n_batch=4096)
    core = EngineCore(model, cfg, executor=ex)
    out: list = []
    contexts = (128, 2048) if quick else (128, 1024, 3072)
    for ctx in (c for c in contexts if c + 64 < ctx_max):  # decode: B sequences, steps after prefill
        for b in ((1, 4, 8) if quick else (1, 2, 4, 8, 16)):
            for s in range(b):
                _submit(core, _prompt(s + ctx, ctx, vocab), 6)
            core.step()  # (every prompt's prefill: one step, not kept)
            _steps(core, ex, out)
    for n in ((64, 512, 2048) if quick else (32, 128, 512, 1024, 2048)):  # prefill of one prompt
        for _ in range(2):
            _submit(core, _prompt(n, n, vocab), 1)
            _steps(core, ex, out, skip=0)
    sess = core.open_session(core.pool.acquire("session", 0))  # a chunk after a long cached prefix
    for start, n in ((2048, 256),) if quick else ((1024, 128), (3072, 256)):
        p = _prompt(3, start, vocab)
        _submit(core, p, 1, sess)
        _steps(core, ex, [], skip=0)
        _submit(core, p + sess.seq.tokens[len(p):] + _prompt(4, n, vocab), 1, sess)
        _steps(core, ex, out, skip=0)
    return out


def calibrate(lm, quick: bool = False, name: str | None = None) -> StepCosts:
    model = getattr(lm, "model", lm)
    data = samples(model, quick)
    copy = _tier_copy_s(model)
    return StepCosts.fit(data, name=name or "cpu (calibrated)", tier_copy_s_per_page=copy, page_tokens=16,
                         source="agentrt.sim.calibrate: real EngineCore steps timed on this machine, "
                                f"{len(data)} samples; tier copy measured by HostTier")


def _tier_copy_s(model) -> float:
    from agentrt.kv.tier import HostTier
    from agentrt.model.kv import KVStore

    store = KVStore.allocate(model.cfg, 16, 16, model.kv_dtype)
    return statistics.median(HostTier(store, 1 << 30).copy_s_per_page for _ in range(3))
