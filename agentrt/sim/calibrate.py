"""Calibration: this machine's step cost model, fitted to real engine steps.

Two sources of samples:
* **a grid**, which the model is fitted to (StepCosts.fit, non-negative least squares): real
  EngineCore steps (the model's forward plus everything the step does around it: batch metadata,
  sampling, bookkeeping) timed over chosen shapes -- decode steps of 1-16 sequences at short and
  long contexts, prefill chunks of 32-2048 tokens, chunks after a cached prefix -- so the model
  covers shapes a short workload never reaches, each shape equally;
* **under load** (`loaded_samples`): every step of a multi-agent workload run through the async
  Engine (sessions, mixed prefill and decode batches, tools sleeping, tokens streamed to the
  clients beside the step thread), as the engine's step observers see it. It checks the fit on
  the batches a real run makes (`loaded_rel_err_mean`), and the gap between one step's end and
  the next one's start while work is queued (planning, commands, handing events to the event
  loop) is the loop's own cost per step, `StepCosts.loop_s`.
The tier's copy cost is HostTier's own measurement. `agentrt bench calibrate` writes the result
as JSON."""

from __future__ import annotations

import random
import statistics
import time
from contextlib import aclosing

import anyio

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.engine import Engine
from agentrt.engine.executor import ModelExecutor
from agentrt.model.loaders.load import LoadedModel
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
        for b in ((1, 2, 4, 8) if quick else (1, 2, 4, 8, 16)):
            for s in range(b):
                _submit(core, _prompt(s + ctx, ctx, vocab), 6)
            core.step()  # (every prompt's prefill: one step, not kept)
            _steps(core, ex, out)
    for n in ((32, 128, 512, 1024) if quick else (32, 128, 512, 1024, 2048)):  # prefill of one prompt
        for _ in range(2):
            _submit(core, _prompt(n, n, vocab), 1)
            _steps(core, ex, out, skip=0)
    sess = core.open_session(core.pool.acquire("session", 0))  # a chunk after a long cached prefix
    for start, n in ((1024, 128), (2048, 256)) if quick else ((1024, 128), (3072, 256)):
        p = _prompt(3, start, vocab)
        _submit(core, p, 1, sess)
        _steps(core, ex, [], skip=0)
        _submit(core, p + sess.seq.tokens[len(p):] + _prompt(4, n, vocab), 1, sess)
        _steps(core, ex, out, skip=0)
    return out


class _StepLog:
    """A step observer: (shape, seconds) of every step, and the loop's gap before each step that
    followed a step with work still queued."""

    def __init__(self, core: EngineCore):
        self.core = core
        self.samples: list[tuple[list[tuple[int, int]], float]] = []  # ([(start, n) per chunk], seconds)
        self.gaps: list[float] = []
        self._end: float | None = None

    def __call__(self, chunks, seconds: float) -> None:
        now = time.perf_counter()
        if self._end is not None:
            self.gaps.append(max(0.0, now - seconds - self._end))
        self.samples.append(([(c.start, len(c.tokens)) for c in chunks], seconds))
        self._end = now if self.core.has_work() else None


def loaded_samples(lm, seconds: float = 30.0, agents: int = 4, seed: int = 0) -> tuple[list, list[float]]:
    """(steps, gaps) of a multi-agent workload run for `seconds` through the async Engine: agents
    on sessions sharing a 256-token system prefix, each turn appending 32-512 new tokens and
    decoding 4-48 (streamed), then a tool sleeping 0-0.3 s."""
    model = lm.model if isinstance(lm, LoadedModel) else lm
    vocab, rng = model.cfg.vocab_size, random.Random(seed)
    cfg = EngineConfig(response_cache_size=0, enable_speculation=False)
    head = _prompt(seed, 256, vocab)

    async def agent(eng: Engine, i: int, until: float) -> None:
        async with await eng.open_session(tag=f"cal{i}") as s:
            p = head + _prompt(1000 + i, rng.randrange(32, 256), vocab)
            while time.perf_counter() < until and len(p) < 3000:
                out: list[int] = []  # streamed, as conversations and servers read it
                sp = SamplingParams(max_tokens=rng.randrange(4, 48), ignore_eos=True)
                async with aclosing(eng.generate(p, sp, session=s)) as stream:
                    async for ev in stream:
                        out.extend(ev.token_ids)
                await anyio.sleep(rng.uniform(0.0, 0.3))
                p = p + out + _prompt(rng.randrange(1 << 20), rng.randrange(32, 512), vocab)

    async def main() -> _StepLog:
        async with Engine(model, cfg) as eng:
            log = _StepLog(eng.core)
            eng.core.step_observers.append(log)
            until = time.perf_counter() + seconds
            while time.perf_counter() < until:  # a fresh set of agents when every history is long
                async with anyio.create_task_group() as tg:
                    for i in range(agents):
                        tg.start_soon(agent, eng, i, until)
            return log
    log = anyio.run(main)
    return log.samples[1:], log.gaps


def calibrate(lm, quick: bool = False, name: str | None = None, loaded_s: float | None = None) -> StepCosts:
    """Fitted to the grid; checked on a loaded run (`loaded_s` seconds; default 20, 8 when
    quick), whose median gap between steps is `loop_s`."""
    model = lm.model if isinstance(lm, LoadedModel) else lm
    grid = samples(model, quick)
    loaded, gaps = loaded_samples(lm, loaded_s if loaded_s is not None else (8.0 if quick else 20.0))
    copy = _tier_copy_s(model)
    costs = StepCosts.fit(grid, name=name or "cpu (calibrated)", tier_copy_s_per_page=copy, page_tokens=16,
                          loop_s=statistics.median(gaps) if gaps else 0.0,
                          source="agentrt.sim.calibrate: real EngineCore steps timed on this machine "
                                 f"over a grid of {len(grid)} shapes; checked on {len(loaded)} steps of a "
                                 "multi-agent workload through the async Engine, whose median gap between "
                                 "steps is loop_s; tier copy measured by HostTier")
    costs.details.update(grid_rel_err_mean=costs.rel_err(grid), loaded_rel_err_mean=costs.rel_err(loaded),
                         loaded_steps=len(loaded), loop_gaps=len(gaps))
    return costs


def _tier_copy_s(model) -> float:
    from agentrt.kv.store import KVStore
    from agentrt.kv.tier import HostTier

    store = KVStore.allocate(model.cfg, 16, 16, model.kv_dtype, device=model.device)
    return statistics.median(HostTier(store, 1 << 30).copy_s_per_page for _ in range(3))
