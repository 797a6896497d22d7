"""Speculation inside the step loop: choose each decoder's draft, then verify and roll back."""

from __future__ import annotations

import torch

from agentrt.config import EngineConfig
from agentrt.engine.request import Request
from agentrt.sampling.speculative import NgramIndex, draft_cap, verify_greedy, verify_sampled


def choose_draft(r: Request, n_decoders: int, cfg: EngineConfig, ctx_len: int) -> list[int]:
    """Draft tokens for r this step (empty: plain decode). Constrained requests never draft:
    a draft could leave the grammar, and checking it would cost a mask per draft token."""
    if not cfg.enable_speculation or r.constraint is not None:
        return []
    if r.ngrams is None:
        r.ngrams = NgramIndex(cfg.spec_min_ngram, cfg.spec_max_ngram)
        r.ngrams.extend(r.target)
    cap = draft_cap(cfg.spec_max_draft, n_decoders, cfg.spec_token_budget, r.acceptance,
                    cfg.spec_min_acceptance)
    room = min(r.params.max_tokens - len(r.output), ctx_len - len(r.target)) - 1
    return r.ngrams.draft(min(cap, room))


def verify(r: Request, logits: torch.Tensor, argmax) -> list[int]:
    """Tokens r accepts this step from logits [1 + len(draft), V] (1 .. len(draft) + 1)."""
    if r.params.greedy:
        acc = verify_greedy(logits, r.draft, argmax)
    else:
        acc = verify_sampled(logits, r.draft, r.params, r.generator)
    r.spec_proposed += len(r.draft)
    r.spec_accepted += len(acc) - 1
    return acc
