"""Speculation inside the step loop: choose each decoder's draft, then verify and roll back."""

from __future__ import annotations

import torch

from agentrt.config import EngineConfig
from agentrt.engine.request import Request
from agentrt.sampling.speculative import NgramIndex, draft_cap, verify_greedy, verify_sampled


def choose_draft(r: Request, n_decoders: int, cfg: EngineConfig, ctx_len: int) -> list[int]:
    """Draft tokens for r this step (empty: plain decode). A constrained (grammar) request
    speculates only when greedy: its draft is cut to the prefix the grammar accepts, and each
    position is verified under its own mask (one mask per draft token, a few microseconds).
    Sampled constrained requests do not speculate."""
    if not cfg.enable_speculation or (r.constraint is not None and not r.params.greedy):
        return []
    if r.ngrams is None:
        r.ngrams = NgramIndex(cfg.spec_min_ngram, cfg.spec_max_ngram)
        r.ngrams.extend(r.target)
    cap = draft_cap(cfg.spec_max_draft, n_decoders, cfg.spec_token_budget, r.acceptance,
                    cfg.spec_min_acceptance)
    room = min(r.params.max_tokens - len(r.output), ctx_len - len(r.target)) - 1
    draft = r.ngrams.draft(min(cap, room))
    if draft and r.constraint is not None:
        draft = draft[:r.constraint.accepts_prefix(draft)]
    return draft


def verify(r: Request, logits: torch.Tensor, argmax) -> list[int]:
    """Tokens r accepts this step from logits [1 + len(draft), V] (1 .. len(draft) + 1)."""
    if r.constraint is not None:
        acc = verify_constrained(r, logits, argmax)
    elif r.params.greedy:
        acc = verify_greedy(logits, r.draft, argmax)
    else:
        acc = verify_sampled(logits, r.draft, r.params, r.generator)
    r.spec_proposed += len(r.draft)
    r.spec_accepted += len(acc) - 1
    return acc


def verify_constrained(r: Request, logits: torch.Tensor, argmax) -> list[int]:
    """Greedy verification under the grammar: position i is masked by the grammar state after
    the tokens accepted before it, exactly as plain constrained decoding would mask it. The
    constraint advances only over tokens that are kept, so nothing needs rolling back."""
    out: list[int] = []
    for i in range(len(r.draft) + 1):
        row = r.constraint.mask_logits(logits[i].clone())
        t = int(argmax(row[None])[0])
        out.append(t)
        r.constraint.advance(t)
        if i == len(r.draft) or t != r.draft[i] or r.constraint.is_terminated():
            break
    return out
