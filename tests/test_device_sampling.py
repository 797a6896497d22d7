"""Sampling on the logits' device (agentrt/sampling/device.py): the Gumbel-max draws follow the
host sampler's distribution (sampler.adjusted_probs: temperature, top-k, top-p), a draw depends on
its request's seed and position only (alone = batched, in any order), greedy rows are the
argmax, and a NaN row is reported, not drawn. On CPU the kernel runs in triton's interpreter."""

from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()

pytest.importorskip("triton")
from agentrt.sampling import SamplingParams, adjusted_probs  # noqa: E402
from agentrt.sampling.device import draw_seed, floors, sample  # noqa: E402

DEV = "cuda" if CUDA else "cpu"
ARGMAX = lambda x: torch.argmax(x, dim=-1)  # noqa: E731

CASES = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=3),
         SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=1.0, top_k=5, top_p=0.7),
         SamplingParams(temperature=1.0, min_p=0.2), SamplingParams(temperature=0.8, top_p=0.9, min_p=0.1)]


@pytest.mark.parametrize("p", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_floors_keep_exactly_the_host_samplers_support(p):  # (min-p included)
    x = torch.randn(5, 50, generator=torch.Generator().manual_seed(1))
    v = x.shape[-1]
    f = floors((x / p.temperature).to(DEV), torch.full((5,), p.top_k or v, device=DEV),
               torch.full((5,), p.top_p, device=DEV), torch.full((5,), p.min_p, device=DEV)).cpu()
    kept = (x / p.temperature) >= f[:, None]
    assert torch.equal(kept, adjusted_probs(x, p) > 0)


@pytest.mark.parametrize("p", [CASES[0], CASES[3], CASES[5]], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_draws_follow_the_host_samplers_distribution(p):
    row = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -3.0])
    n = 2000  # (the interpreter runs ~200 programs a second)
    logits = row.repeat(n, 1).to(DEV)
    ids = sample(logits, [p] * n, [draw_seed(12345, i) for i in range(n)], ARGMAX).cpu()
    freq = torch.bincount(ids, minlength=7).double() / n
    want = adjusted_probs(row, p).double()
    assert (freq - want).abs().max() < 0.045  # (4 standard errors of a frequency near 0.5 at n = 2000)
    assert freq[want == 0].sum() == 0  # nothing outside top-k / top-p


def test_a_draw_depends_on_its_seed_and_position_only():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 300, generator=g).to(DEV)
    params = [SamplingParams(temperature=1.0, top_k=40), SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9),
              SamplingParams(temperature=1.0), SamplingParams(temperature=2.0), SamplingParams(temperature=1.0, top_k=3)]
    seeds = [draw_seed(s, 7) if not p.greedy else None for s, p in zip(range(100, 106), params)]
    batched = sample(logits, params, seeds, ARGMAX).cpu()
    alone = torch.cat([sample(logits[i:i + 1], params[i:i + 1], seeds[i:i + 1], ARGMAX).cpu() for i in range(6)])
    order = [4, 2, 0, 5, 1, 3]
    shuffled = sample(logits[order], [params[i] for i in order], [seeds[i] for i in order], ARGMAX).cpu()
    assert torch.equal(batched, alone) and torch.equal(shuffled, batched[order])
    assert batched[1] == logits[1].argmax().item()  # the greedy row
    other = sample(logits[:1], params[:1], [draw_seed(100, 8)], ARGMAX)  # the next position: a new draw
    assert len({int(sample(logits[:1], params[:1], [draw_seed(100, i)], ARGMAX)) for i in range(12)}) > 1
    assert other.shape == (1,)


def test_a_nan_row_is_reported_and_the_others_are_drawn():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(4))
    logits[1, 7] = float("nan")
    ids = sample(logits.to(DEV), [SamplingParams(temperature=1.0)] * 2 + [SamplingParams()],
                 [draw_seed(1, 0), draw_seed(2, 0), None], ARGMAX).cpu()
    assert ids[1] == -1 and 0 <= ids[0] < 40 and ids[2] == logits[2].argmax()


def test_draw_seeds_are_int64_and_distinct():
    seeds = {draw_seed(s, i) for s in (0, 1, 2 ** 62) for i in range(50)}
    assert len(seeds) == 150 and all(-(2 ** 63) <= s < 2 ** 63 for s in seeds)
