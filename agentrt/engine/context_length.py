"""Whether a request fits the context: the one rule the engine, a Conversation and the server apply.

A request is its prompt plus the room its reply may take (`max_tokens`, at least 1). On an engine
it fits when it stays within the model's context (max_position_embeddings) and within the KV
pool's whole pages under the high-water mark (`kv_limit`): a longer one could never run.
`context_limit` is the smaller of the two (`Engine.max_context_tokens`); a caller that only
knows that number (a Conversation, the server, a driver of a remote replica) passes it as is.
"""

from __future__ import annotations

from agentrt.config import EngineConfig
from agentrt.errors import ContextLengthExceeded


def kv_limit(cfg: EngineConfig) -> int:
    """Tokens one request may hold in the KV pool: the whole pages under the high-water mark."""
    return int(cfg.high_water * cfg.num_pages) * cfg.page_size


def context_limit(model_context: int, cfg: EngineConfig) -> int:
    """The longest request (prompt + max_tokens) an engine with `cfg` can ever take."""
    return min(model_context, kv_limit(cfg))


def context_overflow(prompt_tokens: int, max_tokens: int, limit: int, *, what: str = "the context",
                     hint: str = "") -> ContextLengthExceeded | None:
    """None when a prompt of `prompt_tokens` and a reply of up to `max_tokens` fit `limit` (and
    max_tokens >= 1), else the error to raise (or to map: the server makes it an OpenAI 400).
    `what` names the limit and `hint` ends the message with what the caller can do."""
    if max_tokens >= 1 and prompt_tokens + max_tokens <= limit:
        return None
    return ContextLengthExceeded(f"the prompt ({prompt_tokens} tokens) and max_tokens ({max(max_tokens, 0)}) "
                                 f"do not fit {what} of {limit} tokens{hint}")
