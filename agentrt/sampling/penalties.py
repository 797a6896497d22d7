"""Repetition penalties on a logits row, in place, on whatever device the row is (records/params.py
gives the rules): OpenAI's presence and frequency penalties over the generated tokens, and the
CTRL / Hugging Face repetition penalty over the prompt and the generated tokens. Applied before
temperature, masks and sampling, to greedy rows too; nothing here reads the row back to the host."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from agentrt.records.params import SamplingParams


def penalize(row: torch.Tensor, p: SamplingParams, output: Sequence[int], prompt: Sequence[int] = ()) -> torch.Tensor:
    """row [V] or [1, V] with p's penalties for a request that has seen `prompt` and generated
    `output`; returned (the same tensor, changed in place)."""
    if not p.penalized:
        return row
    with torch.inference_mode(row.is_inference()):  # (the model's rows are inference tensors)
        _apply(row.view(-1), p, output, prompt)
    return row


def _apply(flat: torch.Tensor, p: SamplingParams, output: Sequence[int], prompt: Sequence[int]) -> None:
    dev = flat.device
    if p.repetition_penalty != 1.0 and (prompt or output):
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long).to(dev, non_blocking=True)
        vals = flat.index_select(0, seen)
        flat.index_copy_(0, seen, torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty))
    if output and (p.presence_penalty or p.frequency_penalty):
        counts = Counter(output)
        ids = torch.tensor(list(counts), dtype=torch.long).to(dev, non_blocking=True)
        n = torch.tensor(list(counts.values()), dtype=flat.dtype).to(dev, non_blocking=True)
        flat.index_add_(0, ids, -(p.presence_penalty + p.frequency_penalty * n))


__all__ = ["penalize"]
