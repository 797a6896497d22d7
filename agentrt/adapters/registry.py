"""The engine's loaded adapters by name, and what a request's adapter name means for its rows and
its KV identity.

Names are how callers choose; fingerprints are what KV is keyed by (kv/identity.py). Loading a
name again replaces it (its new weights get a new fingerprint, so no KV of the old ones is
reused); unloading forgets the name. A request holds its LoraAdapter object, so one already
running finishes on the weights it started with. Changed only in the engine's step thread.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentrt.adapters.gguf_files import is_gguf, read_gguf_lora
from agentrt.adapters.lora import LoraAdapter
from agentrt.adapters.peft_files import read_peft
from agentrt.errors import AdapterError, UnknownAdapter


class AdapterRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, LoraAdapter] = {}

    def add(self, adapter: LoraAdapter) -> LoraAdapter | None:
        """Register `adapter` under its name; returns the adapter it replaced, if any."""
        old = self._by_name.get(adapter.name)
        self._by_name[adapter.name] = adapter
        return old

    def remove(self, name: str) -> LoraAdapter:
        adapter = self.get(name)
        del self._by_name[name]
        return adapter

    def get(self, name: str) -> LoraAdapter:
        adapter = self._by_name.get(name)
        if adapter is None:
            loaded = ", ".join(sorted(self._by_name)) or "none"
            raise UnknownAdapter(f"no adapter named {name!r} is loaded (loaded: {loaded}); "
                                 "load it with engine.load_adapter(name, path)")
        return adapter

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def fingerprints(self) -> set[str]:
        return {a.fingerprint for a in self._by_name.values()}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._by_name.values())

    def resolve(self, name: str | None, prompt: list[int]) -> tuple[LoraAdapter | None, int]:
        """The adapter a request named `name` (None: the base model) runs, and the first
        position it computes: an aLoRA from the last occurrence of its invocation tokens in
        `prompt`, and not at all when they are absent (the base model throughout, as in PEFT)."""
        adapter = self.get(name) if name else None
        start = None if adapter is None else adapter.activation_start(prompt)
        return (None, 0) if start is None else (adapter, start)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def read_adapter(name: str, path, model, dtype: str | None = None) -> LoraAdapter:
    """Read the adapter at `path` for `model` (a PEFT directory or a llama.cpp GGUF LoRA file), on
    the model's device. Kept in
    `dtype` ("float32" or "bfloat16"; None: on the CPU its file's own precision, fp32 or bf16,
    elsewhere the model's). Runs off the step loop (it reads files and hashes weights)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise AdapterError(f"an adapter name must be a non-empty string of at most 200 characters, got {name!r}")
    if not isinstance(path, (str, Path)):
        raise AdapterError(f"path must be a PEFT adapter directory or a llama.cpp LoRA .gguf file (str or Path), "
                           f"got {type(path).__name__}")
    if dtype is not None and dtype not in DTYPES:
        raise AdapterError(f"dtype must be one of {sorted(DTYPES)} or None (the file's own), got {dtype!r}")
    root = Path(path)
    if not root.exists():
        raise AdapterError(f"no adapter at {root}: the path does not exist")
    if root.is_file() and not is_gguf(root):
        raise AdapterError(f"{root} is a file but not a GGUF one; pass a PEFT adapter's directory "
                           "(adapter_config.json + adapter_model.safetensors) or a llama.cpp LoRA .gguf file")
    want = DTYPES[dtype] if dtype else (None if model.device.type == "cpu" else model.dtype)
    read = read_gguf_lora if root.is_file() else read_peft
    return read(root, model.cfg, name, want).to(model.device, None)  # (fingerprinted as kept)
