"""Read a PEFT LoRA directory (`adapter_config.json` + `adapter_model.safetensors`, as
`PeftModel.save_pretrained` writes it) into a LoraAdapter.

Supported: q/k/v/o/gate/up/down_proj targets of any layer subset, any rank (`rank_pattern`),
`lora_alpha` (`alpha_pattern`), rsLoRA scaling (alpha / sqrt(r)), and activated LoRA's
`alora_invocation_tokens`. Refused with UnsupportedAdapter: DoRA, LoRA biases, modules_to_save,
embedding or lm_head targets, other PEFT types; with AdapterMismatch: shapes or layers the base
model does not have.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch

from agentrt.adapters.lora import TARGETS, LoraAdapter, build_adapter
from agentrt.errors import AdapterError, UnsupportedAdapter

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[\w-]+)?\.weight$")


def read_peft(path, cfg, name: str, dtype: torch.dtype | None = None) -> LoraAdapter:
    """The adapter in directory `path` for a model of config `cfg`, named `name`, kept in
    `dtype` (None: the file's own precision)."""
    root = Path(path)
    config = peft_config(root)
    mats = {}
    for (layer, target), (a, b) in peft_matrices(root).items():
        rank = a.shape[0]
        alpha = _pattern(config.get("alpha_pattern") or {}, layer, target, config.get("lora_alpha", 8))
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        mats[(layer, target)] = (a, b, scale)
    inv = config.get("alora_invocation_tokens")
    if inv is not None and (not isinstance(inv, list) or not inv or not all(isinstance(x, int) for x in inv)):
        raise AdapterError(f"{root}: alora_invocation_tokens must be a non-empty list of token ids, got {inv!r}")
    meta = {"format": "peft", "r": config.get("r"), "lora_alpha": config.get("lora_alpha"),
            "use_rslora": bool(config.get("use_rslora")), "base_model": config.get("base_model_name_or_path")}
    return build_adapter(name, str(root), cfg, mats, None if inv is None else tuple(inv), meta, dtype)


def peft_matrices(root: Path) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, target) -> (lora_A, lora_B) of the PEFT directory `root`, as saved."""
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in _tensors(root).items():
        m = _KEY.search(key)
        if m is None or m.group(2) not in TARGETS:
            raise UnsupportedAdapter(f"{root}: tensor {key!r} is not a LoRA matrix of a q/k/v/o/gate/up/down "
                                     "projection (embedding, lm_head and DoRA weights are not supported)")
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = t
    for (layer, target), ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{root}: layer {layer} {target} has lora_{''.join(ab)} without its pair; "
                               "the file is incomplete: save the adapter again")
    return {k: (ab["A"], ab["B"]) for k, ab in pairs.items()}


def peft_config(root: Path) -> dict:
    """The directory's adapter_config.json, checked: a LoRA PEFT can run (typed errors otherwise)."""
    file = root / "adapter_config.json"
    if not file.is_file():
        raise AdapterError(f"{root} is not a PEFT adapter directory (no adapter_config.json); pass the folder "
                           "that PeftModel.save_pretrained wrote, or a llama.cpp LoRA .gguf file")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{file}: unreadable adapter config ({exc})") from exc
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise UnsupportedAdapter(f"{file}: peft_type {kind!r}; only LoRA adapters are supported")
    for flag, what in (("use_dora", "DoRA"), ("lora_bias", "LoRA biases"), ("use_qalora", "QA-LoRA"),
                       ("fan_in_fan_out", "fan_in_fan_out (Conv1D) layers")):
        if config.get(flag):
            raise UnsupportedAdapter(f"{file}: {what} is not supported; merge the adapter into the weights instead")
    if config.get("bias", "none") != "none":
        raise UnsupportedAdapter(f"{file}: bias={config['bias']!r} trains the base model's biases; not supported")
    if config.get("modules_to_save"):
        raise UnsupportedAdapter(f"{file}: modules_to_save {config['modules_to_save']} replaces whole modules; "
                                 "not supported")
    return config


def _tensors(root: Path) -> dict[str, torch.Tensor]:
    st, pt = root / "adapter_model.safetensors", root / "adapter_model.bin"
    try:
        if st.is_file():
            from safetensors.torch import load_file

            return load_file(st)
        if pt.is_file():
            return torch.load(pt, map_location="cpu", weights_only=True)
    except Exception as exc:  # (a truncated or foreign file: safetensors and torch raise their own kinds)
        raise AdapterError(f"{root}: unreadable adapter weights ({type(exc).__name__}: {exc}); save it again") from exc
    raise AdapterError(f"{root} has no adapter_model.safetensors (or adapter_model.bin)")


def _pattern(patterns: dict, layer: int, target: str, default):
    """PEFT's per-module override: the first key matching the module's name (or its end)."""
    names = (f"model.layers.{layer}.self_attn.{target}", f"model.layers.{layer}.mlp.{target}")
    for key, value in patterns.items():
        if any(re.fullmatch(rf"(.*\.)?{key}", n) for n in names):
            return value
    return default
