"""What a simulated request says: scripted outputs, replayed token for token.

A real run records each prompt's output (`ScriptBook.record`); a simulated run of the same
workload replays it, so its tool calls, lengths, stops and therefore its next prompts (and
prefix-cache hits) match the real run's. A prompt with no recording gets synthetic tokens: a
deterministic function of the prompt, `max_tokens` long (synthetic workloads at scale)."""

from __future__ import annotations

import hashlib
import random
from array import array


def prompt_key(prompt) -> bytes:
    return hashlib.blake2b(array("q", prompt).tobytes(), digest_size=16).digest()


class ScriptBook:
    """prompt -> the output tokens a simulated request emits."""

    def __init__(self, vocab: tuple[int, int] = (16, 272)):
        self._outputs: dict[bytes, tuple[int, ...]] = {}
        self.vocab = vocab  # synthetic tokens are drawn from [lo, hi)
        self.replayed = self.synthesized = 0

    def __len__(self) -> int:
        return len(self._outputs)

    def record(self, prompt, output) -> None:
        self._outputs[prompt_key(prompt)] = tuple(output)

    def output(self, prompt, max_tokens: int) -> tuple[int, ...]:
        """The recorded output of `prompt`, else `max_tokens` synthetic tokens."""
        key = prompt_key(prompt)
        got = self._outputs.get(key)
        if got is not None:
            self.replayed += 1
            return got
        self.synthesized += 1
        rng = random.Random(key)
        got = tuple(rng.randrange(*self.vocab) for _ in range(max_tokens))
        self._outputs[key] = got
        return got
