"""Hugging Face transformers as a peer: what a user gets from `model.generate` on the same
weights. One model shared by all agents; every call prefills its whole prompt (no KV kept
across calls), then force-decodes the output one token per step with its KV cache. Calls are
serialised in arrival order.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from pathlib import Path

import torch

from bench.peers.base import CallRecord, RunResult, SerialModel, drive, forced_token
from bench.workloads.replay import ModelCall


@contextlib.contextmanager
def _fast_gguf_names():
    """transformers rebuilds gguf's (pure) tensor-name map hundreds of times per load; cache it
    for the duration of the load (as tests/test_gguf_loader.py does)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def load_hf_gguf(path: str | Path):
    """The GGUF at `path` loaded by transformers (dequantized to fp32), in eval mode."""
    import transformers

    path = Path(path)
    with _fast_gguf_names():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def hf_forced(model, prompt: list[int], output: list[int], t_submit: float) -> tuple[list[int], float]:
    """Prefill `prompt`, then force-decode `output` with the KV cache; (tokens, first-token time).
    Only the last position's logits are computed (`logits_to_keep=1`, as `generate` does)."""
    name = _cache_name(model)
    dev = model.device  # (the model's device: a GPU peer gets its ids there)
    out = model(torch.tensor([prompt], device=dev), use_cache=True, logits_to_keep=1)
    toks = [forced_token(out.logits[0, -1], output[0])]
    first = time.perf_counter()
    for want in output[1:]:
        out = model(torch.tensor([[toks[-1]]], device=dev), use_cache=True, logits_to_keep=1, **{name: getattr(out, name)})
        toks.append(forced_token(out.logits[0, -1], want))
    return toks, first - t_submit


def _cache_name(model) -> str:
    """The KV-cache argument/output name: `cache` (transformers >= 5.2x) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TransformersSystem:
    """transformers, full prompt every call, serialised."""

    name = "transformers"

    def __init__(self, model) -> None:
        self.model = model

    @classmethod
    def load(cls, gguf_path: str | Path) -> "TransformersSystem":
        return cls(load_hf_gguf(gguf_path))

    def _call(self, c: ModelCall, t_submit: float) -> CallRecord:
        toks, ttft = hf_forced(self.model, c.prompt, c.output, t_submit)
        total = time.perf_counter() - t_submit
        return CallRecord(c.agent, c.turn, ttft, total, len(c.prompt), len(c.prompt), len(toks),
                          toks == c.output)

    async def warmup(self) -> None:
        hf_forced(self.model, list(range(100, 164)), [5, 6, 7, 8], time.perf_counter())

    async def run(self, scripts, arrival: str) -> RunResult:
        records, wall = await drive(scripts, arrival, SerialModel(self._call))
        n = sum(r.prompt_tokens for r in records)
        return RunResult(self.name, records, wall, {"prompt_submitted": n, "prompt_computed": n,
                                                    "prompt_cached": 0, "hit_rate": 0.0})
