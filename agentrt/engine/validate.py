"""Checks a request must pass before the engine does any work for it."""

from __future__ import annotations

from agentrt.errors import ConfigError, ContextLengthExceeded, OutOfKVMemory
from agentrt.sampling import SamplingParams


def validate_request(core, prompt, params, seq_id, session) -> None:
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not prompt:
        raise ConfigError("the prompt is empty; give at least one token")
    vocab = core.model.cfg.vocab_size
    if any(not isinstance(t, int) or t < 0 or t >= vocab for t in prompt):
        raise ConfigError(f"prompt token ids must be ints in [0, {vocab})")
    ctx = core.model.cfg.max_position_embeddings
    total = len(prompt) + params.max_tokens
    if total > ctx:
        raise ContextLengthExceeded(
            f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} = {total} exceeds "
            f"the model's context of {ctx}; shorten the conversation or lower max_tokens")
    if core.kvm.pages_for(total) > core.cfg.high_water * core.cfg.num_pages:
        raise OutOfKVMemory(
            f"a request of {total} tokens can never fit under the KV pool's high-water mark "
            f"({core.cfg.high_water:.0%} of {core.cfg.kv_cache_tokens} tokens); raise "
            "EngineConfig.kv_cache_tokens or lower max_tokens")
    if session is not None:
        if session.closed:
            raise ConfigError("this session is closed; open a new one")
        if session.busy:
            raise ConfigError("this session already has a turn running; await it first")
    elif seq_id is None:
        raise ConfigError("a transient request needs a sequence id from the pool")
