"""The naive reference path: one sequence, a private KV store, whole-prompt prefill, then one
token per step. Tests use it as the oracle for every batching/caching/speculation path. It
runs on the model's device (`model.device`): its KV store is made there and each step's batch
moved there; the logits come back to the host for sampling."""

from __future__ import annotations

import torch

from agentrt.adapters.apply import LoraStep
from agentrt.errors import ConfigError, ContextLengthExceeded
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.decoder import DecoderModel
from agentrt.model.staging import HostStaging
from agentrt.sampling import SamplingParams, make_generator, sample_row
from agentrt.sampling.penalties import penalize


def prompt_logits(model: DecoderModel, prompt: list[int], page_size: int = 16,
                  path: str | None = None, adapter=None) -> torch.Tensor:
    """Logits [len(prompt), V] of a single full-prompt forward (under LoRA `adapter`: a
    LoraAdapter, from its activation point on)."""
    pages = list(range(-(-len(prompt) // page_size)))
    kv = KVStore.allocate(model.cfg, len(pages), page_size, model.kv_dtype, device=model.device)
    chunks = [_chunk(prompt, 0, pages, _active(adapter, prompt), want_logits=len(prompt))]
    fb = build_batch(chunks, page_size, short_limit=model.short_limit).to(model.device)
    return model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path, **_lora(chunks))


def _active(adapter, prompt: list[int]) -> tuple:
    """(adapter, first position it computes), or (None, 0): the base model, an aLoRA whose
    invocation is not in the prompt too."""
    start = None if adapter is None else adapter.activation_start(prompt)
    return (None, 0) if start is None else (adapter, start)


def _chunk(ids: list[int], pos: int, pages: list[int], active: tuple, want_logits: int = 1) -> SeqChunk:
    return SeqChunk(ids, pos, pages, want_logits, adapter=active[0], adapter_from=active[1])


def _lora(chunks: list[SeqChunk]) -> dict:
    """The forward's `lora` argument, only when a row runs an adapter (models without adapter
    support keep working)."""
    step = LoraStep.of(chunks)
    return {} if step is None else {"lora": step}


def generate(model: DecoderModel, prompt: list[int], params: SamplingParams | None = None,
             eos_token_ids: tuple[int, ...] = (), page_size: int = 16, constraint=None,
             path: str | None = None, fast_forward: bool = False, adapter=None) -> list[int]:
    """Generate up to params.max_tokens ids after `prompt`; stops after an eos/stop token
    (which is included in the output). `constraint` (a LogitsConstraint) masks each step's
    logits before sampling and sees every sampled token; generation also stops when it
    reports is_terminated(). `path` picks the model's forward ("eager": the torch reference).
    `fast_forward`: after each sampled token (and at the start) the ids the constraint forces
    (`constraint.fast_forward`, constrain/forcing.py) are appended and fed one per step.
    `adapter`: a LoraAdapter the sequence runs (an aLoRA from its invocation in the prompt on)."""
    p = params or SamplingParams()
    if not prompt:
        raise ConfigError("generate() needs a non-empty prompt")
    total = len(prompt) + p.max_tokens
    if total > model.cfg.max_position_embeddings:
        raise ContextLengthExceeded(
            f"prompt ({len(prompt)}) + max_tokens ({p.max_tokens}) exceeds the model's "
            f"context of {model.cfg.max_position_embeddings} tokens")
    pages = list(range(-(-total // page_size)))
    kv = KVStore.allocate(model.cfg, len(pages), page_size, model.kv_dtype, device=model.device)
    staging = HostStaging(model.device)
    gen = make_generator(p.seed if p.seed is not None else 0)
    stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
    ff = constraint.fast_forward if fast_forward and constraint is not None else None
    out = ff(None, p.max_tokens - 1)[1] if ff else []
    if out and (out[-1] in stops or constraint.is_terminated()):
        return out  # (the grammar forced the whole output)
    pos, feed = 0, [list(prompt)] + [[t] for t in out]  # the prompt in one chunk, then one id per step
    active = _active(adapter, prompt)
    while len(out) < p.max_tokens:
        for ids in feed:
            chunks = [_chunk(ids, pos, pages, active)]
            fb = build_batch(chunks, page_size, short_limit=model.short_limit).to(model.device, staging)
            logits = model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path, **_lora(chunks)).cpu()
            pos += len(ids)
        row = penalize(logits[0], p, out, prompt)
        row = row if constraint is None else constraint.mask_logits(row)
        new = [sample_row(row, p, gen)]
        if constraint is not None:
            constraint.advance(new[0])
            if ff and new[0] not in stops:
                replaced, ids = ff(new[0], p.max_tokens - len(out) - 1)
                new = new[:1 - replaced] + ids
        for i, tok in enumerate(new):
            out.append(tok)
            last = i == len(new) - 1
            if tok in stops or (last and constraint is not None and constraint.is_terminated()) \
                    or len(out) >= p.max_tokens:
                return out
        feed = [[t] for t in new]
    return out
