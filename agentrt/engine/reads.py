"""The base of the Engine facade (engine/engine.py): its core and step loop, what runs in the step
thread, and what it reads of the core from any thread under the step lock: a session's tokens, the
context limit, stats, the decision trace, a read for observers (agentrt.dashboard), the cached
prefix of a prompt (cache-aware routing)."""

from __future__ import annotations

from collections.abc import Callable

from agentrt.checks import check_optional_str
from agentrt.engine.context_length import context_limit
from agentrt.engine.core import EngineCore
from agentrt.engine.loop import StepThread
from agentrt.engine.validate import check_prompt
from agentrt.errors import ConfigError


class EngineReads:
    """The engine's core and its step loop (a StepThread, or the simulator's), and reads between
    two steps."""

    def __init__(self, core: EngineCore, steps: StepThread):
        self.core, self._steps = core, steps

    async def run_in_step_thread(self, fn: Callable[[], object]) -> object:
        """Run fn() in the step thread, between two steps (it never races the step loop), and
        return its result or raise its exception. The wait is shielded from cancellation: fn's
        effect is never lost. EngineClosed / EngineFailed when the engine cannot run it."""
        return await self._steps.invoke(fn)

    def _check_open(self) -> None:
        self._steps.check_open()

    def session_tokens(self, es) -> list[int]:
        """A copy of the token ids whose KV an engine session holds (read under the step lock)."""
        with self._steps.lock:
            return list(es.seq.tokens)

    @property
    def max_context_tokens(self) -> int:
        """The longest request (prompt + max_tokens) this engine can ever take: the model's context,
        and what fits under the KV pool's high-water mark (engine/context_length.py)."""
        return context_limit(self.core.model.cfg.max_position_embeddings, self.core.cfg)

    def stats(self):
        with self._steps.lock:
            return self.core.stats()

    def decision_trace(self) -> list[dict]:
        """The last `EngineConfig.decision_trace` scheduling decisions, oldest first
        (scheduling/trace.py: candidates, score terms, resident prefixes, evictions)."""
        trace = self.core.scheduler.trace
        if trace is None:
            raise ConfigError("the decision trace is off; set EngineConfig.decision_trace to the decisions to keep")
        with self._steps.lock:
            return trace.as_dicts()

    def inspect(self, fn: Callable[[EngineCore], object]) -> object:
        """fn(core) between two steps (under the step lock, like stats()), from any thread: a
        consistent read of the core's state for an observer (agentrt.dashboard). fn must only read,
        and be quick: the step loop waits for it. Call it off the event loop (a thread)."""
        with self._steps.lock:
            return fn(self.core)

    def cached_prefix_len(self, tokens: list[int], cache_salt: str | None = None) -> int:
        """How many leading tokens of `tokens` the prefix cache holds now, in whole pages (0
        without a radix cache): what a router asks each replica to send a prompt where most of it
        is cached (cache-aware routing). A read under the step lock, like stats(): no access time
        changes, nothing is locked or evicted."""
        prompt = check_prompt(tokens)
        check_optional_str("cache_salt", cache_salt)
        radix = self.core.radix
        if radix is None:
            return 0
        with self._steps.lock:
            return radix.peek(prompt, cache_salt)
