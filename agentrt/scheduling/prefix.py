"""Prefix reuse at admission: session longest-common-prefix rollback, radix matching, and
prefix-grouped prefill (one leader prefills a block that several new requests share)."""

from __future__ import annotations

from agentrt.fingerprint import fnv1a
from agentrt.kv.identity import shared_until
from agentrt.kv.kv_manager import KVManager
from agentrt.kv.radix import RadixCache
from agentrt.prefixes import common_prefix
from agentrt.records.request import Request


def attach_prefix(req: Request, kvm: KVManager, radix: RadixCache | None,
                  session_reuse: bool, promote=None) -> int:
    """Point req.seq at the longest reusable KV for its target; returns tokens reused.

    A session keeps the longest common prefix of what it holds and the new prompt and drops
    the rest (an edited or rolled-back history stays correct), cut back to a point its
    sliding-window layers can go on from (kv/window.py). The radix tree may offer a
    longer prefix (another agent's identical system prompt). At least one token is always
    left to compute, because the next logits need a forward pass. `promote(tokens)` first
    brings the demoted continuation of the tree's match back from the KV tier.
    """
    target, seq = req.target, req.seq
    limit = len(target) - 1
    keep = common_prefix(seq.tokens, target) if session_reuse else 0
    if (until := shared_until(seq.adapted, req.adapted)) is not None:  # (KV of another adapter)
        keep = min(keep, until)
    kvm.truncate(seq, kvm.valid_point(seq.pages, min(keep, limit)))
    seq.adapted = req.adapted
    if radix is not None and promote is not None:
        promote(target[:limit])
    if radix is not None:
        m = radix.match_prefix(target[:limit], req.space)
        if req.adapted.start > m.length:  # (an aLoRA: the base model's KV serves it before its start)
            b = radix.match_prefix(target[:min(limit, req.adapted.start)], req.cache_salt)
            m = b if b.length > m.length else m
        n = kvm.valid_point(m.pages, m.length)  # (short of m where a window's pages were released)
        if n > seq.num_cached:
            kvm.release(seq)
            kvm.alias(seq, target[:n], m.pages)
            req.lock_node = radix.lock_match(m)
    return seq.num_cached


def group_new_requests(reqs: list[Request], k: int) -> None:
    """Among requests admitted together, make followers of requests whose targets are identical
    from token 0 to at least k tokens past their match point: a follower waits until its leader
    holds the shared block, then aliases the leader's pages for all of it (so the tokens before
    the match point must be the same too: two sessions at the same length with different
    histories share nothing). Candidates are found by a hash of the next k tokens and checked
    from token 0."""
    leaders: dict[tuple, list[Request]] = {}
    for r in reqs:
        start, tgt = r.seq.num_cached, r.target
        if len(tgt) - start <= k:
            continue
        candidates = leaders.setdefault((r.space, start, fnv1a(tgt[start:start + k])), [])
        for lead in candidates:
            shared = min(common_prefix(lead.target, tgt), len(tgt) - 1, len(lead.target) - 1)
            if shared - start >= k:
                r.leader, r.share_end = lead, shared
                break
        else:
            candidates.append(r)
