"""The engine's LoRA adapters: load, replace and unload them while it runs (docs/adapters.md).

Reading and hashing an adapter runs in a worker thread; registering it runs in the step
thread between two steps, so a step never sees half a change. Requests already running keep
the weights they started with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio

from agentrt.adapters.registry import read_adapter
from agentrt.checks import check_adapter_name
from agentrt.engine.reads import EngineReads


@dataclass(frozen=True)
class AdapterInfo:
    """A loaded adapter as callers see it."""

    name: str
    source: str
    rank: int
    targets: tuple[str, ...]
    fingerprint: str  # the content digest its KV is keyed by (kv/identity.py)
    activated: bool  # an aLoRA: the base model's KV before its invocation tokens
    invocation_tokens: tuple[int, ...] | None
    nbytes: int
    dtype: str  # the precision it is kept in ("float32", "bfloat16")


class EngineAdapters(EngineReads):
    """The engine's adapters, over the core and step loop of its base (EngineReads)."""

    async def load_adapter(self, name: str, path: str | Path, dtype: str | None = None) -> AdapterInfo:
        """Load the LoRA adapter at `path` (a PEFT directory) as `name`, replacing one of that
        name (its KV is not reused: the new weights have a new fingerprint). `dtype`: the
        precision it is kept in, "float32" or "bfloat16" (None: its file's own on the CPU, the
        model's on a GPU; bf16 halves the bytes a step reads). AdapterMismatch when it does not
        fit the model, UnsupportedAdapter for DoRA and other kinds."""
        self._check_open()
        adapter = await anyio.to_thread.run_sync(read_adapter, name, path, self.core.model, dtype)
        await self.run_in_step_thread(lambda: self.core.adapters.add(adapter))
        return _info(adapter)

    async def unload_adapter(self, name: str) -> None:
        """Forget the adapter `name` (UnknownAdapter if none is loaded); its cached KV ages out."""
        self._check_open()
        check_adapter_name("name", name)
        await self.run_in_step_thread(lambda: self.core.adapters.remove(name))

    def adapters(self) -> dict[str, AdapterInfo]:
        """The loaded adapters by name."""
        reg = self.core.adapters
        return {n: _info(reg.get(n)) for n in reg.names()}


def _info(a) -> AdapterInfo:
    return AdapterInfo(a.name, a.source, a.rank, a.targets, a.fingerprint, a.activated, a.invocation_tokens,
                       a.nbytes, a.dtype)
