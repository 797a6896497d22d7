"""llama.cpp's GGUF LoRA files: read one into a LoraAdapter, and write one from a PEFT directory
(what llama.cpp's `convert_lora_to_gguf.py` writes, so llama.cpp and llama-cpp-python load it).

The layout (llama.cpp's `llama-adapter.cpp` reads it): `general.type = "adapter"`,
`adapter.type = "lora"`, `adapter.lora.alpha`, and for an activated LoRA
`adapter.alora.invocation_tokens`; per target `blk.N.<tensor>.weight.lora_a` (A, [rank, in]) and
`.lora_b` (B, [out, rank]), F32/F16/BF16/Q8_0. One alpha for every target; the scaling is
alpha / rank, as llama.cpp applies it. Llama-architecture files hold attn_q/attn_k rows
permuted for llama.cpp's interleaved RoPE (the base model's converter does it to B, the rows):
reading undoes it, writing does it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from agentrt.adapters.lora import LoraAdapter, build_adapter
from agentrt.adapters.peft_files import peft_config, peft_matrices
from agentrt.errors import AdapterError, AdapterMismatch, UnsupportedAdapter

# llama.cpp's converter permutes attn_q/attn_k rows for these (model/loaders/gguf.py's
# PERMUTED_ARCHS: the base model's loader undoes the same; a test keeps the two equal)
PERMUTED_ARCHS = ("llama", "mistral", "mixtral")

# GGUF tensor name -> PEFT target (model/loaders/gguf.py's block names)
GGUF_TARGETS = {"attn_q": "q_proj", "attn_k": "k_proj", "attn_v": "v_proj", "attn_output": "o_proj",
                "ffn_gate": "gate_proj", "ffn_up": "up_proj", "ffn_down": "down_proj"}
_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16,
          gguf.GGMLQuantizationType.Q8_0}


def is_gguf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"GGUF"


def read_gguf_lora(path, cfg, name: str, dtype: torch.dtype | None = None) -> LoraAdapter:
    """The llama.cpp LoRA file `path` for a model of config `cfg`, named `name` (kept in `dtype`;
    None: bf16 when the file holds BF16, else fp32)."""
    path = Path(path)
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise AdapterError(f"{path}: unreadable GGUF ({exc}); the file is truncated or damaged") from exc
    meta = {k: f.contents() for k, f in reader.fields.items()}
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise AdapterError(f"{path} is a GGUF file but not a LoRA adapter (general.type "
                           f"{meta.get('general.type')!r}, adapter.type {meta.get('adapter.type')!r}); "
                           "pass a file written by llama.cpp's convert_lora_to_gguf.py")
    arch = meta.get("general.architecture")
    if arch is not None and arch != _gguf_arch(cfg):
        raise AdapterMismatch(f"{path}: a LoRA for architecture {arch!r}, but the model is {_gguf_arch(cfg)!r}; "
                              "load the adapter on the model it was trained on")
    alpha = meta.get("adapter.lora.alpha")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for t in reader.tensors:
        layer, target, half = _parse(path, t.name)
        if t.tensor_type not in _TYPES:
            raise UnsupportedAdapter(f"{path}: tensor {t.name} is {t.tensor_type.name}; LoRA files of F32, F16, "
                                     "BF16 or Q8_0 are supported (convert with --outtype f32/f16/bf16/q8_0)")
        pairs.setdefault((layer, target), {})[half] = _tensor(t)
    mats = {}
    for (layer, target), ab in sorted(pairs.items()):
        if set(ab) != {"a", "b"}:
            raise AdapterError(f"{path}: layer {layer} {target} has lora_{''.join(ab)} without its pair; "
                               "the file is incomplete: convert the adapter again")
        a, b = ab["a"], ab["b"]
        if target in ("q_proj", "k_proj") and arch in PERMUTED_ARCHS:
            heads = cfg.num_heads if target == "q_proj" else cfg.num_kv_heads
            if b.shape[0] == heads * cfg.head_dim:  # (a misfit is named by build_adapter)
                b = unpermute_rope_rows(b, heads)
        rank = a.shape[0]
        mats[(layer, target)] = (a, b, (rank if alpha is None else float(alpha)) / rank)
    inv = meta.get("adapter.alora.invocation_tokens")
    info = {"format": "gguf", "lora_alpha": alpha, "architecture": arch}
    return build_adapter(name, str(path), cfg, mats, None if not inv else tuple(int(x) for x in inv), info, dtype)


def _parse(path: Path, tensor: str) -> tuple[int, str, str]:
    parts = tensor.split(".")
    if (len(parts) != 5 or parts[0] != "blk" or not parts[1].isdigit() or parts[2] not in GGUF_TARGETS
            or parts[3] != "weight" or parts[4] not in ("lora_a", "lora_b")):
        raise UnsupportedAdapter(f"{path}: tensor {tensor!r} is not a LoRA matrix of a q/k/v/o/gate/up/down "
                                 "projection (token embedding, output and norm tensors are not supported)")
    return int(parts[1]), GGUF_TARGETS[parts[2]], parts[4][-1]


def _tensor(t) -> torch.Tensor:
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    array = np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    out = torch.from_numpy(array)
    return out.to(torch.bfloat16) if t.tensor_type == gguf.GGMLQuantizationType.BF16 else out  # (exact)


def _gguf_arch(cfg) -> str:
    return {"mistral": "llama"}.get(cfg.arch, cfg.arch)


def write_gguf_lora(peft_dir, cfg, out, outtype: str = "f32") -> Path:
    """Write the PEFT LoRA directory `peft_dir` (for a model of config `cfg`) as a llama.cpp GGUF
    LoRA file at `out`, in "f32", "f16" or "bf16". One alpha: an adapter whose targets scale
    differently (alpha_pattern, rank_pattern, rsLoRA) is refused, as llama.cpp has no way to say it."""
    types = {"f32": (np.float32, gguf.GGMLQuantizationType.F32), "f16": (np.float16, gguf.GGMLQuantizationType.F16),
             "bf16": (None, gguf.GGMLQuantizationType.BF16)}
    if outtype not in types:
        raise AdapterError(f"outtype must be one of {sorted(types)}, got {outtype!r}")
    root = Path(peft_dir)
    config = peft_config(root)
    if config.get("use_rslora") or config.get("alpha_pattern") or config.get("rank_pattern"):
        raise UnsupportedAdapter(f"{root}: rsLoRA, alpha_pattern and rank_pattern have no GGUF LoRA form "
                                 "(llama.cpp scales every target by one alpha / rank)")
    arch = _gguf_arch(cfg)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(config.get("lora_alpha", 8)))
    inv = config.get("alora_invocation_tokens")
    if inv:
        w.add_key_value(gguf.Keys.Adapter.ALORA_INVOCATION_TOKENS, [int(x) for x in inv], gguf.GGUFValueType.ARRAY,
                        gguf.GGUFValueType.UINT32)
    names = {v: k for k, v in GGUF_TARGETS.items()}
    np_type, qtype = types[outtype]
    for (layer, target), (a, b) in sorted(peft_matrices(root).items()):
        if target in ("q_proj", "k_proj") and arch in PERMUTED_ARCHS:
            b = permute_rope_rows(b, cfg.num_heads if target == "q_proj" else cfg.num_kv_heads)
        for half, m in (("a", a), ("b", b)):
            m = m.float().contiguous()
            data = gguf.quants.quantize(m.numpy(), qtype) if np_type is None else m.numpy().astype(np_type)
            w.add_tensor(f"blk.{layer}.{names[target]}.weight.lora_{half}", data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def unpermute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of permute_rope_rows (per head: the interleaved rows back into two halves)."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def permute_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row permutation (the inverse of unpermute_rope_rows): per head, the two
    halves of the rows interleaved."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()
