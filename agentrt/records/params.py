"""Per-request sampling settings."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass

from agentrt.checks import check_bool, check_float, check_int, set_frozen
from agentrt.errors import ConfigError

# Below this a temperature is greedy: logits / 1e-40 overflow float32 and the softmax turns to
# NaN, and anything this cold picks the argmax anyway. Such temperatures are stored as 0.0.
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy (so is any temperature below MIN_TEMPERATURE, stored as 0.0).
    top_k 0 = off. top_p 1.0 = off. min_p 0.0 = off: after top-k and top-p, tokens less likely
    than min_p times the likeliest are dropped. seed: None -> derived from the prompt
    (prompt-deterministic sampling), else mixed with it. stop_token_ids: any iterable of token ids
    (kept as a tuple).

    Penalties, applied to the logits before everything else (greedy rows too), from the tokens
    the request has seen (sampling/penalties.py): presence_penalty and frequency_penalty
    (OpenAI's, in [-2, 2]; over the generated tokens: logit -= presence * [count > 0] +
    frequency * count) and repetition_penalty (the CTRL / Hugging Face rule, > 0, 1.0 = off; over
    the prompt and the generated tokens: a positive logit divided by it, a negative one
    multiplied). A penalized request does not speculate (its drafts would change its counts).

    Every field is checked here (type, finite range), so a bad value raises ConfigError at
    construction and never reaches the engine step."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_p: float = 0.0  # (the fields added later come last: positional calls keep their meaning)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        put = functools.partial(set_frozen, self)

        put("max_tokens", check_int("SamplingParams.max_tokens", self.max_tokens, min=1))
        t = check_float("SamplingParams.temperature", self.temperature, min=0.0)
        put("temperature", 0.0 if t < MIN_TEMPERATURE else t)
        put("top_k", check_int("SamplingParams.top_k (0 disables it)", self.top_k, min=0))
        p = check_float("SamplingParams.top_p (1.0 disables it)", self.top_p, min=0.0, max=1.0, min_open=True)
        put("top_p", p)
        put("min_p", check_float("SamplingParams.min_p (0.0 disables it)", self.min_p, min=0.0, max=1.0))
        for name in ("presence_penalty", "frequency_penalty"):
            put(name, check_float(f"SamplingParams.{name} (0.0 disables it)", getattr(self, name), min=-2.0, max=2.0))
        put("repetition_penalty", check_float("SamplingParams.repetition_penalty (1.0 disables it)",
                                              self.repetition_penalty, min=0.0, min_open=True))
        if self.seed is not None:
            put("seed", check_int("SamplingParams.seed (None: derived from the prompt)", self.seed))
        put("stop_token_ids", _token_ids(self.stop_token_ids))
        put("ignore_eos", check_bool("SamplingParams.ignore_eos", self.ignore_eos))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def replace(self, **changes) -> "SamplingParams":
        return dataclasses.replace(self, **changes)


def _token_ids(value) -> tuple[int, ...]:
    name = "SamplingParams.stop_token_ids"
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        raise ConfigError(f"{name} must be a tuple or list of token ids (ints >= 0), got "
                          f"{type(value).__name__}; for stop strings encode them with the tokenizer")
    return tuple(check_int(f"{name}[{i}]", t, min=0) for i, t in enumerate(value))
