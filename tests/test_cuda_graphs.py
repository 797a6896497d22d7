"""CUDA graphs of the decode step (model/graphs.py) against the eager step, natively on a GPU.

Without CUDA these skip; the parts a graph reads (the batch's placement, the decode-only rule,
the buckets) are checked on the CPU here and in test_device_placement.py."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrt.model.batch import SeqChunk
from agentrt.model.graphs import BUCKETS, bucket_of, is_decode
from tests.conftest import tiny_model

CUDA = torch.cuda.is_available()
PS = 4


def test_buckets_and_the_decode_only_rule():
    assert [bucket_of(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert BUCKETS[0] == 1 and list(BUCKETS) == sorted(BUCKETS)
    assert is_decode([SeqChunk([1], 5, [0, 1])])
    assert not is_decode([SeqChunk([1, 2], 5, [0, 1])])  # (a prefill chunk: eager)
    assert not is_decode([SeqChunk([1], 5, [0, 1], want_logits=0)])
    assert not is_decode([SeqChunk([1], 5, [0, 1])] * (BUCKETS[-1] + 1))
    assert not is_decode([])


def gpu_model():
    from agentrt.kernels.backends import get_backend

    model = copy.deepcopy(tiny_model("llama")).cuda()
    model.ops = get_backend("triton", "cuda")
    return model


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_graph_step_equals_the_eager_step_and_recaptures_for_a_new_pool():
    from agentrt.engine.executor import ModelExecutor

    model = gpu_model()
    runs = {}
    for graphs in (False, True):
        ex = ModelExecutor(model, cuda_graphs=graphs)
        store = ex.allocate(40, PS)
        prompts = [list(range(3 + i, 20 + 3 * i)) for i in range(5)]
        pages = [list(range(8 * i, 8 * i + 8)) for i in range(5)]
        for p, pg in zip(prompts, pages):
            ex.run([], [SeqChunk(p, 0, pg)], store, PS)
        out, pos = [], [len(p) for p in prompts]
        for step in range(6):  # 3 rows (bucket 4, one padding row), then 5 (bucket 8)
            rows = range(3 if step < 3 else 5)
            chunks = [SeqChunk([7 + step], pos[i], pages[i]) for i in rows]
            out.append(torch.cat(ex.run([], chunks, store, PS).rows))
            for i in rows:
                pos[i] += 1
        runs[graphs] = (out, ex)
    eager, graphed = runs[False][0], runs[True][0]
    ex = runs[True][1]
    assert ex.graphs is not None and ex.graphs.replays == 6 and set(ex.graphs.graphs) == {4, 8}
    for a, b in zip(eager, graphed):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    old = ex.graphs
    store2 = ex.allocate(12, PS)  # a new pool: the graphs read the old store's addresses
    ex.run([], [SeqChunk(list(range(5, 9)), 0, [0, 1])], store2, PS)
    ex.run([], [SeqChunk([9], 4, [0, 1])], store2, PS)
    assert ex.graphs is not old and ex.graphs.matches(store2)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_engine_on_the_gpu_equals_naive_greedy():
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams
    from agentrt.model.generate import generate
    from agentrt.model.loaders.load import LoadedModel

    model = gpu_model()
    lm = LoadedModel(model, None, model.cfg, "tiny")
    prompts = [list(range(5 + i, 30 + 2 * i)) for i in range(6)]
    sp = SamplingParams(max_tokens=12, ignore_eos=True)
    ref = [generate(model, p, sp) for p in prompts]

    async def go():
        async with Engine(lm, EngineConfig(response_cache_size=0, page_size=PS, kv_cache_tokens=1024)) as eng:
            outs = [None] * len(prompts)

            async def one(i):
                outs[i] = list((await eng.complete(prompts[i], sp)).token_ids)
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            return outs, eng.stats()
    outs, _ = anyio.run(go)
    assert outs == ref
