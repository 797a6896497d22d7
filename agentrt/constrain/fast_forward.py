"""The engine's side of grammar fast-forward (forcing.py): the ids a request's constraint forces
join the output after the sampled token, and ride the request's next step as one chunk
(`Request.forced`: the scheduler plans them with its decode) instead of one decode step each."""

from __future__ import annotations

from agentrt.records.request import Request


def forced_start(r: Request, cfg, context: int, counters) -> list[int]:
    """Ids the constraint forces before the model's first choice (a required call's
    `<tool_call>{"name": "`): the caller emits them at once, so they join the prefill. One token
    of room is left for the model to sample."""
    if r.constraint is None or not cfg.grammar_fast_forward:
        return []
    _, ids = r.constraint.fast_forward(None, min(r.params.max_tokens, context - len(r.prompt)) - 1)
    if ids:
        counters.ff_jumps += 1
        counters.ff_tokens += len(ids)
    return ids


def fast_forward(r: Request, toks: list[int], cfg, context: int, counters) -> list[int]:
    """toks (the step's new ids, the last one the model's) followed by the ids r's constraint
    forces after them, the last one respelled where the tokenizer merges it with them; sets
    r.forced."""
    if r.constraint is None or not cfg.grammar_fast_forward or toks[-1] in r.stop_ids:
        return toks
    room = min(r.params.max_tokens - len(r.output), context - r.target_len)
    replaced, ids = r.constraint.fast_forward(toks[-1], room - len(toks))
    if not ids:
        return toks
    r.forced = len(ids) - replaced
    counters.ff_jumps += 1
    counters.ff_tokens += r.forced
    counters.ff_healed += replaced
    return toks[:len(toks) - replaced] + ids
