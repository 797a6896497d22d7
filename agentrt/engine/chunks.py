"""The run phase's forward chunks: what each planned request feeds the model this step."""

from __future__ import annotations

from agentrt.model.batch import SeqChunk
from agentrt.records.request import Request


def forward_chunk(r: Request, n: int) -> SeqChunk:
    """r's chunk of n tokens from its KV's end: prefill (logits at the prompt's end), a decode
    (its next token and any forced ids after it), or those plus its draft (logits from the last
    fed token on)."""
    c = r.seq.num_cached
    if r.draft:
        return SeqChunk(r.target_slice(c, n - len(r.draft)) + r.draft, c, r.seq.pages,
                        1 + len(r.draft), r.adapter, r.adapted.start)
    return SeqChunk(r.target_slice(c, n), c, r.seq.pages, int(c + n == r.target_len), r.adapter, r.adapted.start)


def forward_chunks(plan: list[tuple[Request, int]]) -> list[SeqChunk]:
    """The step's chunks, in the plan's order (the logits rows come back in it)."""
    return [forward_chunk(r, n) for r, n in plan]
