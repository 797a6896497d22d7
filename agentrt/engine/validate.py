"""Checks a request must pass before the engine does any work for it, each once: its arguments'
types and ranges at the public entry point (`check_generate_args`, in the caller's task), then
what only the core knows (`check_against_core`, in the step thread at `EngineCore.add_request`:
the vocabulary, the context, the KV pool, the session's state). A caller of the core itself
(the simulator, tests) brings arguments of the right types."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping

from agentrt.checks import check_adapter_name, check_optional_str, check_timeout
from agentrt.engine.context_length import context_overflow, kv_limit
from agentrt.engine.session import Session
from agentrt.errors import ConfigError, OutOfKVMemory
from agentrt.records.constraint import LogitsConstraint
from agentrt.sampling import SamplingParams


def check_params(params, *, allow_none: bool = True) -> SamplingParams:
    """None -> the defaults (ConfigError when not allow_none); a SamplingParams as is; anything
    else ConfigError."""
    if params is None and allow_none:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
    hint = " (build one: SamplingParams(**your_dict))" if isinstance(params, Mapping) else ""
    raise ConfigError(f"params must be a SamplingParams or None, got {type(params).__name__}{hint}")


def check_prompt(prompt, vocab: int | None = None) -> list[int]:
    """A non-empty list or tuple of int token ids -> a new list of Python ints, each in
    [0, vocab) when `vocab` is given (else the core checks the range: check_against_core)."""
    if isinstance(prompt, str):
        raise ConfigError("the prompt must be token ids, not text: encode it first "
                          "(engine.tokenizer.encode(text)) or use a Conversation / Agent")
    if not isinstance(prompt, (list, tuple)):
        # (the error's hint only: what the wrong value looks like, a tensor / array or an iterable)
        if type(prompt).__module__.split(".")[0] in ("torch", "numpy"):
            hint = "; pass a list of ints, e.g. prompt.tolist() of a 1-D tensor or array"
        elif isinstance(prompt, Iterable):
            hint = "; pass a list of ints, e.g. list(prompt)"
        else:
            hint = ""
        raise ConfigError(f"the prompt must be a list of int token ids, got {type(prompt).__name__}{hint}")
    if not prompt:
        raise ConfigError("the prompt is empty; give at least one token")
    # (the common case, plain ints, stays at C speed: prompts reach tens of thousands of tokens)
    out = list(prompt) if all(type(t) is int for t in prompt) else [_token_id(i, t) for i, t in enumerate(prompt)]
    if vocab is not None:
        check_token_range(out, vocab)
    return out


def check_token_range(prompt: list[int], vocab: int) -> None:
    """Every id of a (non-empty, int) prompt in [0, vocab)."""
    if min(prompt) < 0 or max(prompt) >= vocab:
        i = next(i for i, t in enumerate(prompt) if not 0 <= t < vocab)
        raise ConfigError(f"prompt token ids must be ints in [0, {vocab}); prompt[{i}] is {prompt[i]}")


def _token_id(i: int, t) -> int:
    try:
        if isinstance(t, (bool, float, str, bytes)):
            raise TypeError
        return operator.index(t)
    except TypeError:
        raise ConfigError(f"prompt token ids must be ints; prompt[{i}] is {t!r} ({type(t).__name__})") from None


def check_generate_args(engine, prompt, params, *, session=None, cache_salt=None, tag=None,
                        timeout=None, task=None, workflow=None, constraint=None,
                        adapter=None) -> tuple[list[int], SamplingParams]:
    """Engine.generate / complete arguments, checked before any work: (prompt as a list of
    ints, params) or ConfigError. Call it first thing in Engine.generate."""
    params = check_params(params)
    prompt = check_prompt(prompt)
    check_session(engine, session)
    check_constraint(constraint)
    check_adapter_name("adapter", adapter)
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
    if not isinstance(session, Session):
        raise ConfigError(f"session must be a Session from engine.open_session(), got {type(session).__name__}")
    if engine is not None and session.engine is not engine:
        raise ConfigError("this session was opened on another engine; open one with this engine's open_session()")


def check_constraint(constraint) -> None:
    """None, or an object with every method of LogitsConstraint (the engine calls them all)."""
    if constraint is not None and not isinstance(constraint, LogitsConstraint):
        raise ConfigError(f"constraint must implement agentrt.records.constraint.LogitsConstraint (subclass "
                          f"it: each method has a default), got {type(constraint).__name__}")


def check_against_core(core, prompt: list[int], params: SamplingParams, seq_id: int | None, session) -> None:
    """EngineCore.add_request's (already typed) arguments against the core: the token range, the
    context (ContextLengthExceeded) and the KV pool (OutOfKVMemory), the session's state."""
    check_token_range(prompt, core.model.cfg.vocab_size)
    overflow = context_overflow(len(prompt), params.max_tokens, core.model.cfg.max_position_embeddings,
                                what="the model's context", hint="; shorten the conversation or lower max_tokens")
    if overflow is not None:
        raise overflow
    total = len(prompt) + params.max_tokens
    if total > kv_limit(core.cfg):
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
