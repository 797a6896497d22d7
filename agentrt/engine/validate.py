"""Checks a request must pass before the engine does any work for it."""

from __future__ import annotations

import operator
from collections.abc import Mapping

from agentrt.checks import check_optional_str, check_timeout
from agentrt.errors import ConfigError, ContextLengthExceeded, OutOfKVMemory
from agentrt.sampling import SamplingParams


def check_params(params) -> SamplingParams:
    """None -> the defaults; a SamplingParams as is; anything else ConfigError."""
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    hint = " (build one: SamplingParams(**your_dict))" if isinstance(params, Mapping) else ""
    raise ConfigError(f"params must be a SamplingParams or None, got {type(params).__name__}{hint}")


def check_prompt(prompt) -> list[int]:
    """A non-empty list or tuple of int token ids -> a new list of Python ints (the token range
    is checked against the model's vocabulary in validate_request)."""
    if isinstance(prompt, str):
        raise ConfigError("the prompt must be token ids, not text: encode it first "
                          "(engine.tokenizer.encode(text)) or use a Conversation / Agent")
    if not isinstance(prompt, (list, tuple)):
        if hasattr(prompt, "tolist") and hasattr(prompt, "shape"):
            hint = "; pass a list of ints, e.g. prompt.tolist() of a 1-D tensor or array"
        elif hasattr(prompt, "__next__") or hasattr(prompt, "__iter__"):
            hint = "; pass a list of ints, e.g. list(prompt)"
        else:
            hint = ""
        raise ConfigError(f"the prompt must be a list of int token ids, got {type(prompt).__name__}{hint}")
    if not prompt:
        raise ConfigError("the prompt is empty; give at least one token")
    out: list[int] = []
    for i, t in enumerate(prompt):
        try:
            if isinstance(t, (bool, float, str, bytes)):
                raise TypeError
            out.append(operator.index(t))
        except TypeError:
            raise ConfigError(f"prompt token ids must be ints; prompt[{i}] is {t!r} "
                              f"({type(t).__name__})") from None
    return out


def check_generate_args(engine, prompt, params, *, session=None, cache_salt=None, tag=None,
                        timeout=None, task=None, workflow=None) -> tuple[list[int], SamplingParams]:
    """Engine.generate / complete arguments, checked before any work: (prompt as a list of
    ints, params) or ConfigError. Call it first thing in Engine.generate."""
    params = check_params(params)
    prompt = check_prompt(prompt)
    check_session(engine, session)
    check_optional_str("cache_salt", cache_salt)
    check_optional_str("tag", tag)
    for name, v in (("task", task), ("workflow", workflow)):
        check_optional_str(name, v)
        if v == "":
            raise ConfigError(f"{name} must be a non-empty string or None (None: the caller's agentrt.task_scope)")
    check_timeout("timeout (seconds; None: EngineConfig.acquire_timeout)", timeout)
    return prompt, params


def check_open_session_args(tag=None, cache_salt=None, timeout=None) -> None:
    """Engine.open_session arguments."""
    check_optional_str("tag", tag)
    check_optional_str("cache_salt", cache_salt)
    check_timeout("timeout (seconds; None: EngineConfig.acquire_timeout)", timeout)


def check_session(engine, session) -> None:
    """None, or a Session this engine opened (a session belongs to one engine)."""
    if session is None:
        return
    from agentrt.engine.session import Session

    if not isinstance(session, Session):
        raise ConfigError(f"session must be a Session from engine.open_session(), got {type(session).__name__}")
    if engine is not None and getattr(session, "_engine", engine) is not engine:
        raise ConfigError("this session was opened on another engine; open one with this engine's open_session()")


def validate_request(core, prompt, params, seq_id, session) -> None:
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not isinstance(prompt, (list, tuple)):
        raise ConfigError(f"the prompt must be a list of int token ids, got {type(prompt).__name__}")
    if not prompt:
        raise ConfigError("the prompt is empty; give at least one token")
    vocab = core.model.cfg.vocab_size
    if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 or t >= vocab for t in prompt):
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
