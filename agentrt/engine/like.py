"""EngineLike / SessionLike: what the layers above use of an engine and of its sessions.

Two engines satisfy them: the in-process `Engine` (engine.py, its `Session`) and the Ray
`RemoteEngine` (integrations/ray/remote.py, its `RemoteSession`). Agents, conversations, the
runtime and the LangGraph model are typed by these protocols and check a public `engine=`
argument with `isinstance(x, EngineLike)` (runtime_checkable: every member is present), so
neither side imports the other and no caller probes an engine for one method.

Read-only members are properties here: a plain attribute or a class attribute satisfies them.
A session argument is `Any`: each engine takes only the sessions it opened (its own type) and
raises ConfigError for another's, which a protocol parameter cannot say without a type variable.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrt.config import EngineConfig
    from agentrt.engine.shared import EngineShared
    from agentrt.records.request import TokenEvent
    from agentrt.sampling import SamplingParams
    from agentrt.workflow import Workflow


class ModelLike(Protocol):
    """What callers read of an engine's model: its config (`ModelConfig`: vocab_size,
    max_position_embeddings, arch, ...)."""

    @property
    def cfg(self) -> Any: ...


@runtime_checkable
class SessionLike(Protocol):
    """A long-lived KV session an engine opened (`Engine.open_session`)."""

    @property
    def closed(self) -> bool: ...

    @property
    def cache_salt(self) -> str | None: ...

    @property
    def engine_session(self) -> Any: ...  # the step thread's record; None for a replica's session

    async def close(self) -> None: ...

    async def expect_tools(self, tools: Sequence[str]) -> float: ...

    async def fork(self, tag: str | None = None, timeout: float | None = None) -> SessionLike: ...

    async def rollback(self, n_tokens: int) -> None: ...


@runtime_checkable
class EngineLike(Protocol):
    """An engine as agents, conversations, the runtime and the LangGraph model use it."""

    @property
    def tokenizer(self) -> Any: ...  # None for a bare model without one

    @property
    def config(self) -> EngineConfig: ...

    @property
    def model(self) -> ModelLike: ...

    @property
    def model_name(self) -> str | None: ...  # what traces name the model (None: "local")

    @property
    def shared(self) -> EngineShared: ...  # the chat format, grammars and turn log of the layers above

    @property
    def max_context_tokens(self) -> int: ...  # the longest prompt + max_tokens it can take

    @property
    def started(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def alive(self) -> bool: ...  # False once a replica is lost (an in-process engine: always True)

    @property
    def state_store(self) -> Any: ...  # agentrt/state's store, None without one

    @property
    def portal(self) -> Any: ...  # a BlockingPortal onto the engine's event loop (None: none known)

    @property
    def loop_thread_id(self) -> int | None: ...  # the thread whose event loop runs the engine

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def open_session(self, tag: str | None = None, cache_salt: str | None = None,
                           timeout: float | None = None, adapter: str | None = None,
                           key: str | None = None) -> SessionLike: ...

    def generate(self, prompt: list[int], params: SamplingParams | None = None, *, session: Any = None,
                 cache_salt: str | None = None, tag: str | None = None, constraint: Any = None,
                 timeout: float | None = None, task: str | None = None, workflow: str | None = None,
                 adapter: str | None = None) -> AsyncGenerator[TokenEvent, None]: ...

    def stop(self, request_id: int) -> None: ...  # end a live request early (its stream still ends)

    def declare_workflow(self, workflow: Workflow) -> None: ...
