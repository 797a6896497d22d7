"""The naive reference path: one sequence, a private KV store, whole-prompt prefill, then one
token per step. Tests use it as the oracle for every batching/caching/speculation path."""

from __future__ import annotations

import torch

from agentrt.errors import ConfigError, ContextLengthExceeded
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.kv import KVStore
from agentrt.model.llama import LlamaModel
from agentrt.sampling import SamplingParams, make_generator, sample_row


def prompt_logits(model: LlamaModel, prompt: list[int], page_size: int = 16,
                  path: str | None = None) -> torch.Tensor:
    """Logits [len(prompt), V] of a single full-prompt forward."""
    pages = list(range(-(-len(prompt) // page_size)))
    kv = KVStore.allocate(model.cfg, len(pages), page_size, model.kv_dtype)
    fb = build_batch([SeqChunk(prompt, 0, pages, want_logits=len(prompt))], page_size)
    return model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path)


def generate(model: LlamaModel, prompt: list[int], params: SamplingParams | None = None,
             eos_token_ids: tuple[int, ...] = (), page_size: int = 16, constraint=None,
             path: str | None = None) -> list[int]:
    """Generate up to params.max_tokens ids after `prompt`; stops after an eos/stop token
    (which is included in the output). `constraint` (a LogitsConstraint) masks each step's
    logits before sampling and sees every sampled token; generation also stops when it
    reports is_terminated(). `path` picks the model's forward ("eager": the torch reference)."""
    p = params or SamplingParams()
    if not prompt:
        raise ConfigError("generate() needs a non-empty prompt")
    total = len(prompt) + p.max_tokens
    if total > model.cfg.max_position_embeddings:
        raise ContextLengthExceeded(
            f"prompt ({len(prompt)}) + max_tokens ({p.max_tokens}) exceeds the model's "
            f"context of {model.cfg.max_position_embeddings} tokens")
    pages = list(range(-(-total // page_size)))
    kv = KVStore.allocate(model.cfg, len(pages), page_size, model.kv_dtype)
    gen = make_generator(p.seed if p.seed is not None else 0)
    stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
    out: list[int] = []
    chunk = SeqChunk(list(prompt), 0, pages)
    while len(out) < p.max_tokens:
        fb = build_batch([chunk], page_size)
        logits = model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path)
        row = logits[0] if constraint is None else constraint.mask_logits(logits[0])
        tok = sample_row(row, p, gen)
        out.append(tok)
        if constraint is not None:
            constraint.advance(tok)
        if tok in stops or (constraint is not None and constraint.is_terminated()):
            break
        chunk = SeqChunk([tok], chunk.start + len(chunk.tokens), pages)
    return out
