"""Device faults in a step (issue: GPU faults as typed errors), injected into the real executor.

An out-of-memory error in a step's forward fails that step's requests with DeviceOutOfMemory,
halves the step size and leaves the engine serving: later requests equal naive decoding and no
page or sequence slot leaks. Any other error in the forward (an illegal memory access, say) ends
the engine: every caller gets EngineFailed naming it."""

from __future__ import annotations

import anyio
import pytest
import torch

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.engine.executor import ModelExecutor
from agentrt.errors import DeviceOutOfMemory, EngineFailed
from agentrt.model.generate import generate
from agentrt.model.loaders.load import LoadedModel
from tests.conftest import tiny_model


class FaultyExecutor(ModelExecutor):
    """The model's executor, raising `fault` in the forward of step number `at` (1-based)."""

    def __init__(self, model, fault: BaseException, at: int):
        super().__init__(model)
        self.fault, self.at, self.calls = fault, at, 0

    def run(self, plan, chunks, store, page_size):
        self.calls += 1
        if self.calls == self.at:
            raise self.fault
        return super().run(plan, chunks, store, page_size)


def _engine(fault, at):
    model = tiny_model("llama")
    lm = LoadedModel(model, None, model.cfg, "tiny")
    cfg = EngineConfig(response_cache_size=0, page_size=4, kv_cache_tokens=512, debug_invariants=True)
    return Engine(lm, cfg, executor=FaultyExecutor(model, fault, at)), model


@pytest.mark.anyio
async def test_out_of_memory_fails_the_step_and_the_engine_goes_on_with_smaller_steps():
    eng, model = _engine(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), at=2)
    sp = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [list(range(5 + i, 30 + i)) for i in range(3)]
    async with eng:
        n_batch = eng.core.scheduler.sizes.n_batch
        results = [None] * 3

        async def one(i):
            try:
                results[i] = list((await eng.complete(prompts[i], sp)).token_ids)
            except DeviceOutOfMemory as exc:
                results[i] = exc
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(one, i)
        failed = [r for r in results if isinstance(r, DeviceOutOfMemory)]
        assert failed and "retry the request" in str(failed[0])
        assert eng.core.counters.oom_steps == 1 and eng.core.scheduler.sizes.n_batch < n_batch
        assert eng.core.cfg.n_batch == n_batch  # (the engine's config is the user's, unchanged)
        # the engine serves on: the failed prompts again, each equal to naive decoding
        for i, r in enumerate(results):
            out = r if isinstance(r, list) else list((await eng.complete(prompts[i], sp)).token_ids)
            assert out == generate(model, prompts[i], sp)
        eng.core.check_invariants()
        assert not eng.core.running and not eng.core.waiting


@pytest.mark.anyio
async def test_a_fatal_device_error_closes_the_engine_naming_it():
    eng, _ = _engine(RuntimeError("CUDA error: an illegal memory access was encountered"), at=1)
    async with eng:
        with pytest.raises(EngineFailed, match="illegal memory access"):
            await eng.complete(list(range(5, 20)), SamplingParams(max_tokens=4, ignore_eos=True))
        with pytest.raises(EngineFailed, match="illegal memory access"):
            await eng.complete(list(range(5, 9)), SamplingParams(max_tokens=2))
