"""A model's fingerprint: what KV computed by it depends on (its architecture, dtypes and a digest
of its weights). Snapshots (kv/snapshot.py) and the disk tier's keys (engine/durable.py) carry it,
and refuse KV from any other model."""

from __future__ import annotations

import dataclasses
import hashlib

import torch

from agentrt.model.quant import QEmbedding, QLinear

_SLICE = 32  # elements hashed at the start, middle and end of every weight tensor


def model_fingerprint(model) -> dict:
    """What a snapshot's KV depends on: the architecture (model.cfg), the dtype, and a short
    sha256 over deterministic slices of every weight. The digest tells apart two models with
    identical configs (two fine-tunes, two random initialisations) at a cost of microseconds."""
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(model.cfg).items()}
    return {"config": config, "dtype": str(model.dtype).removeprefix("torch."),
            "kv_dtype": str(model.kv_dtype).removeprefix("torch."),
            "weights": _weights_digest(model)}


def _weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, t in _weight_tensors(model):
        flat = t.detach().reshape(-1)
        n, mid = flat.numel(), flat.numel() // 2
        picks = torch.cat([flat[:_SLICE], flat[mid:mid + _SLICE], flat[max(0, n - _SLICE):]])
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(picks.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _weight_tensors(model):
    """Parameters and buffers by name, then packed quantized weights (not registered tensors)."""
    yield from model.state_dict().items()
    for mname, mod in model.named_modules():
        parts = mod.parts if isinstance(mod, QLinear) else [mod.packed] if isinstance(mod, QEmbedding) else []
        for i, pw in enumerate(parts):
            for field in ("q", "s", "m"):
                t = getattr(pw, field)
                if isinstance(t, torch.Tensor):
                    yield f"{mname}.packed{i}.{field}", t
