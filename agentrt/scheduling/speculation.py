"""Speculation in the scheduler's plan: each decoder's draft this step (its n-gram index, the
cap from the decoders and the token budget, the grammar's prefix). Verification of the drafts
after the forward is sampling's (`sampling/speculative.py::verify`), counted by the step
(engine/postprocess.py::verify_draft)."""

from __future__ import annotations

from agentrt.config import EngineConfig
from agentrt.records.request import Request
from agentrt.sampling.speculative import NgramIndex, draft_cap


def choose_draft(r: Request, n_decoders: int, cfg: EngineConfig, ctx_len: int) -> list[int]:
    """Draft tokens for r this step (empty: plain decode). A constrained (grammar) request
    speculates only when greedy: its draft is cut to the prefix the grammar accepts, and each
    position is verified under its own mask (one mask per draft token, a few microseconds).
    Sampled constrained requests do not speculate, nor do penalized ones (each draft token
    would change the counts the next position's penalty reads)."""
    if not cfg.enable_speculation or (r.constraint is not None and not r.params.greedy) or r.params.penalized:
        return []
    if r.ngrams is None:
        r.ngrams = NgramIndex(cfg.spec_min_ngram, cfg.spec_max_ngram)
        r.ngrams.extend(r.target)
    cap = draft_cap(cfg.spec_max_draft, n_decoders, cfg.spec_token_budget, r.acceptance,
                    cfg.spec_min_acceptance)
    room = min(r.params.max_tokens - len(r.output), ctx_len - r.target_len) - 1
    draft = r.ngrams.draft(min(cap, room))
    if draft and r.constraint is not None:
        draft = draft[:r.constraint.accepts_prefix(draft)]
    return draft

