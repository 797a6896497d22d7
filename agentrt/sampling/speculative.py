"""Prompt-lookup speculative decoding: drafts from the request's own history, verification in
the batched forward pass.

Drafting: the last n tokens (n from max_ngram down to min_ngram) are looked up in the request's
history (prompt + output); the tokens that followed their latest earlier occurrence are the
draft. Tool calls repeat names, keys and values that are already in the prompt, so drafts are
often long and right. An index of every n-gram's two latest end positions makes a lookup O(1).

Verification (`verify`, the one entry point, on plain arguments; the engine's step counts what a
request accepts): the draft tokens are extra query positions of their
sequence in the same batch. Greedy: accept the longest draft prefix equal to the argmax, plus the
model's own next token. Constrained (a grammar; greedy only): the same, each position masked by
the grammar state after the tokens accepted before it. Sampling: the draft is a point mass
q(d) = 1, so the standard rule accepts d with probability p(d); on rejection the replacement is
drawn from p with d removed (max(0, p - q) renormalised), which leaves the output distribution
exactly p.
"""

from __future__ import annotations

import torch

from agentrt.records.constraint import LogitsConstraint
from agentrt.records.params import SamplingParams
from agentrt.sampling.sampler import adjusted_probs


class NgramIndex:
    """n-gram -> (latest end, previous end) over a growing token list."""

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], tuple[int, int]] = {}

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n:end])
                last = self._ends.get(key)
                self._ends[key] = (end, last[0] if last else -1)

    def draft(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the current suffix."""
        end = len(self.tokens)
        if k <= 0 or end < 2:
            return []
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            hit = self._ends.get(tuple(self.tokens[end - n:end]))
            if hit is None:
                continue
            prev = hit[1] if hit[0] == end else hit[0]
            if prev > 0:
                return self.tokens[prev:min(prev + k, end)]
        return []


def verify(logits: torch.Tensor, draft: list[int], params: SamplingParams, *,
           constraint: LogitsConstraint | None = None,
           generator: torch.Generator | None = None, argmax=None) -> list[int]:
    """Tokens accepted from logits [k+1, V] at the positions of (last token, draft...): the
    accepted draft prefix plus one token of the model's own (1 .. k+1 tokens). A `constraint`
    (greedy requests only) advances over exactly the tokens returned. argmax: [B, V] -> [B]."""
    if constraint is not None:
        return verify_constrained(logits, draft, constraint, argmax)
    if params.greedy:
        return verify_greedy(logits, draft, argmax)
    return verify_sampled(logits, draft, params, generator)


def verify_greedy(logits: torch.Tensor, draft: list[int], argmax=None) -> list[int]:
    """logits [k+1, V] at the positions of (last token, draft...). Returns the accepted draft
    prefix plus the model's own next token (1 .. k+1 tokens). argmax: [B, V] -> [B]."""
    return accept_greedy((argmax(logits) if argmax else torch.argmax(logits, dim=-1)).tolist(), draft)


def accept_greedy(pred: list[int], draft: list[int]) -> list[int]:
    """The greedy rule on the argmax ids pred [k+1] of (last token, draft...): the draft's
    longest prefix equal to them, then the model's own next token."""
    out = []
    for d, p in zip(draft, pred):
        if d != p:
            break
        out.append(d)
    out.append(pred[len(out)])
    return out


def verify_sampled(logits: torch.Tensor, draft: list[int], params: SamplingParams,
                   gen: torch.Generator | None) -> list[int]:
    """Speculative rejection sampling against a deterministic draft (see module doc)."""
    probs = adjusted_probs(logits, params)  # [k+1, V]
    out = []
    for i, d in enumerate(draft):
        u = torch.rand((), generator=gen).item()
        if u < probs[i, d].item():
            out.append(d)
            continue
        residual = probs[i].clone()
        residual[d] = 0.0
        total = residual.sum()
        if total <= 0:  # p was a point mass on d; cannot happen when u < p(d) fails, kept safe
            out.append(d)
            continue
        out.append(int(torch.multinomial(residual / total, 1, generator=gen)))
        return out
    out.append(int(torch.multinomial(probs[len(draft)], 1, generator=gen)))
    return out


def verify_constrained(logits: torch.Tensor, draft: list[int], constraint: LogitsConstraint,
                       argmax) -> list[int]:
    """Greedy verification under the grammar: position i is masked by the grammar state after
    the tokens accepted before it, exactly as plain constrained decoding would mask it. The
    constraint advances only over tokens that are kept, so nothing needs rolling back."""
    out: list[int] = []
    for i in range(len(draft) + 1):
        row = constraint.mask_logits(logits[i].clone())
        t = int(argmax(row[None])[0]) if argmax else int(torch.argmax(row))
        out.append(t)
        constraint.advance(t)
        if i == len(draft) or t != draft[i] or constraint.is_terminated():
            break
    return out


def draft_cap(max_draft: int, n_decoders: int, token_budget: int, acceptance: float,
              min_acceptance: float) -> int:
    """Per-slot draft length: the step's draft-token budget shared by the active decoders, and
    at most 1 (a probe) while this slot's acceptance rate is below min_acceptance."""
    cap = min(max_draft, token_budget // max(n_decoders, 1))
    if acceptance < min_acceptance:
        cap = min(cap, 1)
    return max(cap, 0)
