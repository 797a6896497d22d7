"""The request records every engine room shares (mutated only by the engine's step thread): a
request's state (`Request`, `State`), what it reports (`Usage`, `TokenEvent`). A session's KV state
(`EngineSession`) is the KV room's own (kv/sessions.py); the forward chunk a request feeds in a
step is built by the engine's run phase (engine/chunks.py)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from agentrt.adapters.lora import LoraAdapter
from agentrt.kv.disk import DiskHit
from agentrt.kv.identity import BASE, Adapted, KVSpace, space
from agentrt.kv.kv_manager import Sequence
from agentrt.kv.radix_node import Node
from agentrt.kv.sessions import EngineSession
from agentrt.records.constraint import LogitsConstraint
from agentrt.records.params import SamplingParams


class State(enum.Enum):
    WAITING = "waiting"  # not admitted yet (no KV work done this turn)
    RUNNING = "running"  # admitted: prefilling or decoding
    FINISHED = "finished"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from KV already held (session or radix)
    computed_prompt_tokens: int  # prompt tokens this turn actually prefilled (incl. recompute)
    completion_tokens: int
    # what the engine did for the request (the numbers a trace shows: agentrt/tracing/)
    queue_wait_s: float = 0.0  # from submission to its (latest) admission, on the core clock
    preemptions: int = 0  # times its KV was dropped for memory and recomputed
    spec_proposed: int = 0  # speculative draft tokens proposed ...
    spec_accepted: int = 0  # ... and accepted
    promoted_tokens: int = 0  # prompt tokens copied back from the KV tier at its admission
    promote_s: float = 0.0  # ... their copy time (pages x the tier's measured cost per page)
    overtook: int = 0  # requests that arrived before it and still waited when the policy admitted it
    prefill_s: float = 0.0  # from its (latest) admission to its first sampled token
    decode_s: float = 0.0  # from its first sampled token to its end


@dataclass(frozen=True)
class TokenEvent:
    """What a request's stream yields: new token ids; the last event has finish_reason set."""

    request_id: int
    token_ids: tuple[int, ...]
    finish_reason: str | None = None  # "stop" | "length" | "early_stop" | "cancelled" | "error"
    usage: Usage | None = None
    error: BaseException | None = None


class Drafter(Protocol):
    """A request's draft source over its target (sampling/speculative.py::NgramIndex)."""

    def extend(self, tokens: list[int]) -> None: ...

    def draft(self, k: int) -> list[int]: ...


@dataclass(eq=False)
class Request:
    rid: int
    prompt: list[int]
    params: SamplingParams
    seq: Sequence
    emit: Callable[[TokenEvent], None]
    session: EngineSession | None = None
    cache_salt: str | None = None
    tag: str | None = None
    constraint: LogitsConstraint | None = None  # (agentrt/records/constraint.py)
    adapter: LoraAdapter | None = None  # its rows run this LoRA from adapted.start (None: base)
    adapted: Adapted = BASE  # its KV's identity (kv/identity.py)
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    state: State = State.WAITING
    output: list[int] = field(default_factory=list)
    arrival: int = 0
    admitted_at: int = 0
    cached_tokens: int = -1  # set at first admission
    computed_prompt: int = 0
    finish_reason: str | None = None
    # prefix-grouped prefill: wait for `leader` to hold positions [0, share_end), then alias
    leader: Request | None = None
    share_end: int = 0
    draft: list[int] = field(default_factory=list)  # this step's speculative tokens
    ngrams: Drafter | None = None  # an index over target, built at its first decode
    spec_proposed: int = 0
    spec_accepted: int = 0
    forced: int = 0  # fast-forwarded ids after the next token to feed (they ride its decode step)
    attached: bool = False  # prefix reuse done for the current admission
    preemptions: int = 0  # times its KV was dropped for memory (scheduling/preemption.py)
    lock_node: Node | None = None  # radix node locked while this request uses its pages
    # workflow facts (agentrt/workflow.py): the task it serves; its stage is `tag`
    task: str | None = None
    workflow: str | None = None
    submitted_s: float = 0.0  # the core clock's now() at add_request
    admitted_s: float = 0.0  # ... at its (latest) admission
    promoted: int = 0  # prompt tokens promoted from the KV tier at its first admission
    promote_s: float = 0.0  # ... their copy time, estimated from the tier's cost per page
    restored: DiskHit | None = None  # its prefix's KV read from the disk tier, adopted at admission
    overtook: int = 0  # earlier arrivals still waiting when it was (last) admitted
    first_token_s: float = 0.0  # ... when its first token was sampled (0: none yet)
    finished_s: float = 0.0  # ... when it finished

    @property
    def space(self) -> str | KVSpace | None:
        """The key its KV is cached and matched under (the salt, and the adapter if any)."""
        return space(self.cache_salt, self.adapted)

    @property
    def target(self) -> list[int]:
        """Tokens whose KV the next logits depend on: prompt + everything sampled so far."""
        return self.prompt + self.output

    @property
    def target_len(self) -> int:
        return len(self.prompt) + len(self.output)

    def target_slice(self, start: int, n: int) -> list[int]:
        """target[start:start + n] without building the whole target (a decode step's one token
        would otherwise copy the context)."""
        p = len(self.prompt)
        if start >= p:
            return self.output[start - p:start - p + n]
        return self.prompt[start:start + n] + self.output[:max(0, start + n - p)]

    @property
    def remaining(self) -> int:
        """Tokens still to feed before the next logits (1 while decoding)."""
        return len(self.prompt) + len(self.output) - self.seq.num_cached

    @property
    def acceptance(self) -> float:
        """Draft acceptance rate so far (optimistic 1.0 before any draft)."""
        return self.spec_accepted / self.spec_proposed if self.spec_proposed else 1.0

    @property
    def in_prefill(self) -> bool:
        return self.remaining > 1 + self.forced or not self.output

    def usage(self) -> Usage:
        wait = self.admitted_s - self.submitted_s if self.admitted_at else 0.0
        end = self.finished_s or self.admitted_s
        first = self.first_token_s or end
        prefill, decode = (max(0.0, first - self.admitted_s), max(0.0, end - first)) if self.admitted_at else (0.0, 0.0)
        return Usage(len(self.prompt), max(self.cached_tokens, 0), self.computed_prompt, len(self.output),
                     wait, self.preemptions, self.spec_proposed, self.spec_accepted, self.promoted,
                     self.promote_s, self.overtook, prefill, decode)
