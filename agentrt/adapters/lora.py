"""A LoRA adapter in the base model's own layout.

The decoder fuses q/k/v into one projection and gate/up into another (model/decoder.py); a LoRA
target is one part of such a fused projection: its rows of A ([rank, in]) shrink the
projection's input, its B ([out_part, rank], the scaling folded in) expands into the part's
columns. `LoraAdapter.layers[layer][projection]` lists those parts.

Identity is content: `fingerprint` is a sha256 over the effective matrices as kept (A, and B with
its scaling; fp32, or bf16 when the file holds bf16), layer and target by layer and target, and
aLoRA's invocation tokens. Two files holding
the same adapter share KV; a name reused for other weights, or a reload of changed weights, does
not (kv/identity.py keys every KV structure by it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace

import torch

from agentrt.errors import AdapterMismatch, UnsupportedAdapter

# a target module's fused projection, and its index among that projection's parts
TARGETS = {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("o", 0),
           "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0)}
PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class LoraPart:
    """One target of one layer: y[:, col:col + b.shape[0]] += (x @ a.T) @ b.T."""

    target: str
    a: torch.Tensor  # [rank, in]
    b: torch.Tensor  # [out_part, rank], scaling folded in
    col: int  # the part's first column in the fused projection's output


def target_shapes(cfg) -> dict[str, tuple[int, int, int]]:
    """target -> (in, out, first output column in its fused projection) for model config `cfg`."""
    hid, inter, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_heads * d, cfg.num_kv_heads * d
    return {"q_proj": (hid, q, 0), "k_proj": (hid, kv, q), "v_proj": (hid, kv, q + kv),
            "o_proj": (q, hid, 0), "gate_proj": (hid, inter, 0), "up_proj": (hid, inter, inter),
            "down_proj": (inter, hid, 0)}


@dataclass
class LoraAdapter:
    """A loaded adapter: its parts per layer and projection, on one device and dtype."""

    name: str
    source: str
    rank: int  # the largest rank of its targets
    targets: tuple[str, ...]
    layers: dict[int, dict[str, tuple[LoraPart, ...]]]
    invocation_tokens: tuple[int, ...] | None = None  # aLoRA: active from their last occurrence
    fingerprint: str = ""
    nbytes: int = 0
    meta: dict = field(default_factory=dict)
    native: object = field(default=None, repr=False, compare=False)  # adapters/native.describe's cache

    @property
    def dtype(self) -> str:
        """The precision it is kept in ("float32", "bfloat16", ...)."""
        for projs in self.layers.values():
            for parts in projs.values():
                return str(parts[0].a.dtype).removeprefix("torch.")
        return "float32"

    @property
    def activated(self) -> bool:
        """An activated LoRA (aLoRA): the base model's KV before its invocation tokens."""
        return self.invocation_tokens is not None

    def activation_start(self, tokens: list[int]) -> int | None:
        """The first position the adapter computes: 0 for a plain LoRA; for an aLoRA the start
        of the last occurrence of its invocation tokens in `tokens`, None when they are absent
        (the request then runs on the base model alone, as PEFT does)."""
        inv = self.invocation_tokens
        if inv is None:
            return 0
        n = len(inv)
        for start in range(len(tokens) - n, -1, -1):
            if tuple(tokens[start:start + n]) == inv:
                return start
        return None

    def to(self, device: torch.device | str, dtype: torch.dtype | None) -> "LoraAdapter":
        """The adapter on `device` in `dtype` (None: its own); B keeps its transposed storage."""
        layers = {i: {p: tuple(replace(x, a=x.a.to(device, dtype).contiguous(), b=_transposed(x.b.to(device, dtype)))
                               for x in parts) for p, parts in projs.items()} for i, projs in self.layers.items()}
        return replace(self, layers=layers, native=None)


def _transposed(b: torch.Tensor) -> torch.Tensor:
    """b [out, rank] as a view of contiguous [rank, out] storage (the kernels expand along out)."""
    return b.t().contiguous().t()


def build_adapter(name: str, source: str, cfg, mats: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]],
                  invocation_tokens: tuple[int, ...] | None = None, meta: dict | None = None,
                  dtype: torch.dtype | None = None) -> LoraAdapter:
    """An adapter from its matrices: (layer, target) -> (A [r, in], B [out, r], scaling), checked
    against model config `cfg` (AdapterMismatch names the first that does not fit), kept in
    `dtype` (None: its own precision, own_dtype) and fingerprinted as kept."""
    if not mats:
        raise AdapterMismatch(f"{source}: the adapter has no LoRA matrices for any of {sorted(TARGETS)}")
    shapes = target_shapes(cfg)
    if cfg.is_moe and any(t in ("gate_proj", "up_proj", "down_proj") for _, t in mats):
        raise UnsupportedAdapter(f"{source}: LoRA on a mixture-of-experts model's MLP is not supported; "
                                 "target the attention projections (q/k/v/o_proj) only")
    h, nbytes = hashlib.sha256(), 0
    layers: dict[int, dict[str, list[LoraPart]]] = {}
    for (layer, target), (a, b, scale) in sorted(mats.items()):
        _check_fits(source, cfg, layer, target, a, b, shapes)
        keep = dtype or own_dtype(a, b)
        a_, b_ = a.detach().to(keep).contiguous(), _transposed((b.detach().float() * scale).to(keep))
        for part in (a_, b_):
            h.update(f"{layer}.{target}{tuple(part.shape)}{keep}".encode())
            h.update(part.float().numpy().tobytes())
        proj = TARGETS[target][0]
        layers.setdefault(layer, {}).setdefault(proj, []).append(LoraPart(target, a_, b_, shapes[target][2]))
        nbytes += (a_.numel() + b_.numel()) * a_.element_size()
    h.update(repr(invocation_tokens).encode())
    frozen = {i: {p: tuple(sorted(parts, key=lambda x: x.col)) for p, parts in projs.items()}
              for i, projs in layers.items()}
    return LoraAdapter(name, source, rank=max(a.shape[0] for a, _, _ in mats.values()),
                       targets=tuple(sorted({t for _, t in mats}, key=list(TARGETS).index)), layers=frozen,
                       invocation_tokens=invocation_tokens, fingerprint=h.hexdigest()[:32],
                       nbytes=nbytes, meta=meta or {})


def own_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """The precision an adapter keeps: bf16 when its file holds bf16, else fp32 (fp16 files are
    widened: the CPU kernel reads fp32 and bf16)."""
    return torch.bfloat16 if a.dtype == b.dtype == torch.bfloat16 else torch.float32


def _check_fits(source: str, cfg, layer: int, target: str, a: torch.Tensor, b: torch.Tensor, shapes) -> None:
    if not 0 <= layer < cfg.num_layers:
        raise AdapterMismatch(f"{source}: layer {layer} of {target}, but the model has {cfg.num_layers} layers; "
                              "load the adapter on the model it was trained on")
    n_in, n_out, _ = shapes[target]
    r = a.shape[0]
    if a.dim() != 2 or b.dim() != 2 or a.shape != (r, n_in) or b.shape != (n_out, r):
        raise AdapterMismatch(
            f"{source}: layer {layer} {target}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the "
            f"model's [{n_out} x {n_in}] projection (expected [r, {n_in}] and [{n_out}, r]); load the adapter on "
            "the model it was trained on")
