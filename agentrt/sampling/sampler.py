"""Token selection: greedy (on-device argmax) or temperature / top-k / top-p with a
per-request torch.Generator, so a request's randomness never depends on its batch-mates."""

from __future__ import annotations

import torch

from agentrt.records.params import SamplingParams


def adjusted_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits [..., V] fp32 -> the distribution sampling draws from (temperature>0)."""
    x = logits / p.temperature
    if p.top_k and p.top_k < x.shape[-1]:
        kth = torch.topk(x, p.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if p.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p (the first always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= p.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    if p.min_p > 0.0:  # (relative to the likeliest, which every rule above keeps)
        probs = probs.masked_fill(probs < p.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_row(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    """logits [V] -> one token id."""
    if p.greedy:
        return int(torch.argmax(logits))
    probs = adjusted_probs(logits, p)
    return int(torch.multinomial(probs, 1, generator=gen))


def sample_batch(logits: torch.Tensor, params: list[SamplingParams],
                 gens: list[torch.Generator | None], argmax=torch.argmax) -> list[int]:
    """logits [B, V]; greedy rows share one argmax call (the kernel backend's, on device)."""
    out: list[int] = [0] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        ids = argmax(logits[greedy] if len(greedy) < len(params) else logits).tolist()
        for i, t in zip(greedy, ids):
            out[i] = t
    for i, p in enumerate(params):
        if not p.greedy:
            out[i] = sample_row(logits[i], p, gens[i])
    return out


def make_generator(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    return g
