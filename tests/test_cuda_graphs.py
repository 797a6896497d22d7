"""CUDA graphs of short steps (model/graphs.py) against the eager step, natively on a GPU.

Without CUDA those skip; the parts a graph reads (its static inputs, filled by the eager step's
own batch builder, the short-step rule, the buckets, the batch's placement) are checked on the
CPU here and in test_device_placement.py: the graph's inputs hold the eager batch's fields, and
a forward over them gives the eager step's logits."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrt.kernels import reference
from agentrt.kernels.base import SHORT_QUERIES
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.graphs import BUCKETS, GraphInputs, bucket_of, is_short
from tests.conftest import tiny_model

CUDA = torch.cuda.is_available()
PS = 4


def test_buckets_and_the_short_step_rule():
    assert [bucket_of(n) for n in (1, 2, 3, 5, 33, 64, 300)] == [1, 2, 4, 8, 64, 64, 512]
    assert BUCKETS[0] == 1 and list(BUCKETS) == sorted(BUCKETS)
    assert is_short([SeqChunk([1], 5, [0, 1]), SeqChunk([1, 2, 3], 5, [0, 1], want_logits=3)])
    assert is_short([SeqChunk([1] * SHORT_QUERIES, 0, list(range(40)), want_logits=0)])
    assert not is_short([SeqChunk([1] * (SHORT_QUERIES + 1), 0, list(range(40)))])  # (a long row: eager)
    assert not is_short([SeqChunk([1] * 60, 5, list(range(40)))] * 9)  # (over the largest bucket)
    assert not is_short([])
    # the batch-invariant mode attends every row token by token, eager or replayed: any length
    assert is_short([SeqChunk([1] * 300, 0, list(range(40))), SeqChunk([2], 9, [0])], short_limit=None)
    assert not is_short([SeqChunk([1] * 600, 0, list(range(40)))], short_limit=None)


STEP = [SeqChunk([7], 9, [3, 4, 5]), SeqChunk([1, 2, 3], 5, [0, 1], want_logits=3),
        SeqChunk([4, 5], 2, [8], want_logits=1), SeqChunk([6], 12, [9, 10, 2, 6], want_logits=0)]


def test_graph_inputs_hold_the_eager_batch_padded_to_a_bucket():
    """One builder: the graph's static inputs (here on the CPU, through a staging buffer) hold
    build_batch's fields for the step's tokens; the padding touches only the scratch page."""
    fb, scratch, t = build_batch(STEP, PS), 11, 7
    inputs = GraphInputs(torch.device("cpu"), PS, 6, scratch)
    assert fb.meta.num_tokens == t and torch.equal(fb.meta.short_tok, torch.arange(t))  # (every row short)
    for b in (16, 8):  # (the second fill overwrites the first one's longer prefix)
        rows = inputs.fill(STEP, b)
        meta, (ids, pos, lrows) = inputs.meta(b)
        assert rows == len(fb.logits_rows) == 5
        for graph, eager in ((ids, fb.input_ids), (pos, fb.positions), (meta.slot_mapping, fb.meta.slot_mapping),
                             (meta.short_seq, fb.meta.short_seq), (meta.short_lens, fb.meta.short_lens)):
            assert torch.equal(graph[:t], eager)
        assert torch.equal(lrows[:rows], fb.logits_rows) and lrows[rows:].eq(0).all()
        for i, c in enumerate(STEP):
            assert torch.equal(meta.page_table[i, :len(c.pages)], fb.meta.page_table[i, :len(c.pages)])
        # padding: token 0 at position 0 with one key, in the scratch page, read through a row of its own
        assert ids[t:].eq(0).all() and pos[t:].eq(0).all() and meta.short_lens[t:].eq(1).all()
        assert meta.slot_mapping[t:].eq(scratch * PS).all() and meta.short_seq[t:].eq(len(STEP)).all()
        assert int(meta.page_table[len(STEP), 0]) == scratch


def token_attention(q, k_cache, v_cache, meta, scale, window=0, softcap=0.0):
    """The triton backend's attention on the CPU: long rows row by row (the reference), every
    token of a short row over its own sequence's first short_lens keys (triton_attention.py)."""
    out = reference.paged_attention_rows(q, k_cache, v_cache, meta, scale, meta.long_rows, window, softcap)
    for t, s, n in zip(meta.short_tok.tolist(), meta.short_seq.tolist(), meta.short_lens.tolist()):
        pages = meta.page_table[s, : -(-n // meta.page_size)]
        k, v = (reference.gather_pages(c, pages)[:, :n] for c in (k_cache, v_cache))  # [Hkv, n, D]
        keep = torch.arange(n) >= n - window if window else torch.ones(n, dtype=torch.bool)
        out[t] = reference.attend(q[t][:, None], k, v, keep[None], scale, softcap)[:, 0]
    return out


class TokenBackend(reference.TorchBackend):
    paged_attention = staticmethod(token_attention)


def test_a_forward_over_the_graph_inputs_gives_the_eager_steps_logits():
    """The step a graph replays, run eagerly on the CPU over its static inputs (padded to the
    bucket), gives the logits of the same step built by build_batch, over the same KV."""
    model = copy.deepcopy(tiny_model("llama"))
    model.ops = TokenBackend()
    scratch = 11
    store = KVStore.allocate(model.cfg, scratch + 1, PS)
    prefill = [SeqChunk(list(range(3, 12)), 0, [3, 4, 5], 0), SeqChunk(list(range(20, 25)), 0, [0, 1], 0),
               SeqChunk([9, 8], 0, [8], 0), SeqChunk(list(range(30, 42)), 0, [9, 10, 2, 6], 0)]
    fb = build_batch(prefill, PS)
    model(fb.input_ids, fb.positions, store, fb.meta, fb.logits_rows, path="eager")
    twin = KVStore(tuple(k.clone() for k in store.k), tuple(v.clone() for v in store.v), PS)
    fb = build_batch(STEP, PS)
    eager = model(fb.input_ids, fb.positions, store, fb.meta, fb.logits_rows, path="eager")
    inputs = GraphInputs(torch.device("cpu"), PS, 6, scratch)
    rows = inputs.fill(STEP, bucket_of(fb.meta.num_tokens))
    meta, (ids, pos, lrows) = inputs.meta(bucket_of(fb.meta.num_tokens))
    graph = model(ids, pos, twin, meta, lrows, path="eager")[:rows]
    torch.testing.assert_close(graph, eager, rtol=1e-5, atol=1e-5)
    assert torch.equal(graph.argmax(-1), eager.argmax(-1))
    for a, b in zip(store.k + store.v, twin.k + twin.v):  # (the padding wrote only the scratch page)
        torch.testing.assert_close(a[:scratch], b[:scratch], rtol=1e-5, atol=1e-5)


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
        store = ex.allocate(60, PS)
        prompts = [list(range(3 + i, 20 + 3 * i)) for i in range(5)]  # (short rows: graphs too)
        pages = [list(range(12 * i, 12 * i + 12)) for i in range(5)]
        for p, pg in zip(prompts, pages):
            ex.run([], [SeqChunk(p, 0, pg)], store, PS)
        out, pos = [], [len(p) for p in prompts]
        # decode rows, then rows of several tokens (verification, fast-forward) beside them
        for step, width in enumerate([(1, 1, 1), (1, 1, 1), (1, 3, 1, 2), (2, 1, 1, 1, 4), (1, 1, 1, 1, 1)]):
            chunks = [SeqChunk([7 + step + j for j in range(k)], pos[i], pages[i], want_logits=1 + (k > 2))
                      for i, k in enumerate(width)]
            out.append(torch.cat(ex.run([], chunks, store, PS).rows))
            for i, k in enumerate(width):
                pos[i] += k
        runs[graphs] = (out, ex)
    eager, graphed = runs[False][0], runs[True][0]
    ex = runs[True][1]
    assert ex.graphs is not None and ex.graphs.replays == 10 and set(ex.graphs.graphs) == {4, 8, 16, 32}
    assert runs[False][1].steps == {"graph": 0, "eager": 10} and ex.steps == {"graph": 10, "eager": 0}
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


class _FailingGraphs:
    def __init__(self, replays):
        self.replays = replays

    def run(self, chunks):
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_first_capture_turns_the_executor_eager_and_a_failed_replay_raises():
    from agentrt.engine.executor import ModelExecutor

    ex = ModelExecutor(tiny_model("llama"))
    ex.cuda_graphs = True  # (as on a GPU)
    assert ex._replay(_FailingGraphs(0), [SeqChunk([1], 0, [0])]) is None
    assert ex.cuda_graphs is False and ex.graphs is None
    with pytest.raises(RuntimeError, match="capturing"):
        ex._replay(_FailingGraphs(3), [SeqChunk([1], 0, [0])])
