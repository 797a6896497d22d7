"""Load a GGUF file (llama.cpp format) into fp32/bf16 tensors under Hugging Face names.

Shapes: GGUF lists dimensions fastest-moving first ([in, out] for a linear weight); torch wants
[out, in], so every shape is reversed. llama-architecture files store attn_q/attn_k rows permuted
for llama.cpp's interleaved RoPE; we undo that so the weights match the HF (half-split) RoPE.
Qwen2/Qwen3 files are written without the permutation (llama.cpp runs them with NeoX RoPE).

Mistral: llama.cpp converts MistralForCausalLM to architecture "llama" (loaded as Llama: the
same computation). A file whose architecture is "mistral" (which llama.cpp does not write, and
transformers cannot load back) is read with the llama layout, Q/K rows permuted. Llama 3 RoPE
scaling arrives as the `rope_freqs.weight` tensor (see rope.py); `{arch}.attention.sliding_window`
(smaller than the context) slides every layer.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from agentrt.errors import CorruptModelFile, ModelNotFound, UnsupportedModel
from agentrt.kernels.packing import QuantMatrix
from agentrt.model.config import SUPPORTED_ARCHS, ModelConfig, window_fields
from agentrt.model.loaders import gemma, gguf_quant
from agentrt.model.loaders.files import ModelFiles, check_dtype, check_weights
from agentrt.model.loaders.gguf_reader import GGUFFile, GGUFFormatError
from agentrt.model.loaders.layouts import rows as layout_rows
from agentrt.model.loaders.layouts import to_model_layout
from agentrt.model.loaders.lazy import LazyQuant, Weight, check_finite
from agentrt.model.rope import rope_from_gguf
from agentrt.model.tokenizer import Tokenizer, tokenizer_from_gguf

_MAGIC = b"GGUF"
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
}
_ROPE_FREQS = "rope_freqs.weight"  # RoPE scaling factors, not a weight (rope.py)
# Phi-3's long-RoPE factors (not weights either), and its fused tensors' HF names
_LONGROPE = ("rope_factors_long.weight", "rope_factors_short.weight")
_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
PERMUTED_ARCHS = ("llama", "mistral", "mixtral")  # Q/K rows permuted for llama.cpp's interleaved RoPE
# mixture-of-experts: the router, and each of gate/up/down as one [experts, out, in] tensor
_MOE_NAMES = {"ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
              "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
              "ffn_down_shexp": "mlp.shared_expert.down_proj"}
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
_ARCH_NAMES = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}  # GGUF architecture -> ours (llama + experts: "mixtral")
# top-k weights renormalised, as llama.cpp runs each family (unless {arch}.expert_weights_norm says)
_NORM_TOPK = {"qwen3_moe": True, "qwen2_moe": False, "mixtral": True, "olmoe": False}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32, native: bool = False) -> ModelFiles:
    """Read config, weights and tokenizer from a GGUF file. Weights are dequantized to `dtype`,
    or with `native=True` quantized matrices stay quantized, unread until the model packs them
    (LazyQuant, loaders/lazy.py: a load's memory peaks at one layer's unpacked matrices)."""
    check_dtype(dtype)
    path = Path(path)
    reader = open_gguf(path)
    meta = read_metadata(reader)
    config = config_from_metadata(meta, {t.name: _torch_shape(t) for t in reader.tensors}, _rope_freqs(reader),
                                  _longrope(reader))
    try:
        weights = _load_weights(reader, config, dtype, native)
    except CorruptModelFile as exc:
        raise CorruptModelFile(f"{path}: {exc}") from None
    check_weights(config, weights, str(path))
    tokenizer = tokenizer_from_gguf(meta) if "tokenizer.ggml.model" in meta else None
    return ModelFiles(config=config, weights=weights, tokenizer=tokenizer, source=str(path))


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """Only the tokenizer (and chat template) of a GGUF file; no tensor is dequantized."""
    return tokenizer_from_gguf(read_metadata(open_gguf(Path(path))))


def open_gguf(path: Path) -> GGUFFile:
    """The parsed header of `path` (tensors are views of a memory map); ModelNotFound /
    CorruptModelFile with what to do about it."""
    if not path.is_file():
        raise ModelNotFound(f"GGUF file {path} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != _MAGIC:
        raise CorruptModelFile(f"{path} is not a GGUF file (magic {magic!r}, expected {_MAGIC!r}); re-download it")
    try:
        return GGUFFile(path)
    except GGUFFormatError as exc:
        raise CorruptModelFile(f"{path}: unreadable GGUF ({exc}); the file is truncated or damaged") from exc


def read_metadata(reader: GGUFFile) -> dict[str, Any]:
    """GGUF key/value metadata as plain Python values (str, int, float, bool, or lists of them)."""
    return dict(reader.fields)


def config_from_metadata(meta: dict[str, Any], shapes: dict[str, tuple[int, ...]],
                         rope_freqs: list[float] | None = None, longrope: dict | None = None) -> ModelConfig:
    """ModelConfig from `{arch}.*` keys; `shapes` (GGUF name -> torch shape) fills gaps and
    tying; `rope_freqs`: the values of rope_freqs.weight, if the file has it."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise CorruptModelFile("GGUF metadata lacks general.architecture; the file was not written by a llama.cpp converter")
    ours = _ARCH_NAMES.get(arch, arch)
    if ours == "llama" and int(meta.get("llama.expert_count") or 0):
        ours = "mixtral"  # (llama.cpp's converter writes Mixtral as llama with experts)
    if ours not in SUPPORTED_ARCHS:
        supported = [a for a in SUPPORTED_ARCHS if a not in (*_ARCH_NAMES.values(), "mixtral")] + list(_ARCH_NAMES)
        raise UnsupportedModel(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(supported)}")

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise CorruptModelFile(f"GGUF metadata lacks {arch}.{key}; the file was not written by a llama.cpp converter")
        return meta[f"{arch}.{key}"]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    tokens = meta.get("tokenizer.ggml.tokens") or ()
    vocab = meta.get(f"{arch}.vocab_size") or shapes.get("token_embd.weight", (len(tokens),))[0]
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    context = int(meta.get(f"{arch}.context_length", 2048))
    theta = _decimal(meta.get(f"{arch}.rope.freq_base", 10000.0))
    rotary = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    factors, attention = rope_from_gguf(meta, arch, rotary, theta, rope_freqs, longrope or {})
    experts = _experts(meta, arch, ours, need)
    n_layers = int(need("block_count"))
    family: dict[str, Any] = {"qk_norm": ours in ("qwen3", "qwen3_moe", "olmoe")}
    windows: tuple[bool, ...] | None = None
    if ours in gemma.PATTERN:
        family = gemma.gguf_fields(meta, arch)
        windows = gemma.sliding_layers(ours, n_layers, pattern=meta.get(f"{arch}.attention.sliding_window_pattern"))
    return ModelConfig(
        arch=ours,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(meta.get(f"{arch}.feed_forward_length") or 0) if experts else int(need("feed_forward_length")),
        num_layers=n_layers,
        num_heads=heads,
        num_kv_heads=_kv_heads(meta.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=theta,
        rms_norm_eps=_decimal(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in shapes,
        attention_bias=any(name.endswith("attn_q.bias") for name in shapes),
        qk_norm_span="all" if ours == "olmoe" else "head",
        rope_freq_factors=factors,
        rope_attention_factor=attention,
        rotary_dim=rotary if rotary != head_dim else None,
        **experts,
        **window_fields(meta.get(f"{arch}.attention.sliding_window"), context, windows),
        **family,  # (attn_q_norm/attn_k_norm where qk_norm is False: unexpected tensors)
    )


def _experts(meta: dict[str, Any], arch: str, ours: str, need) -> dict[str, Any]:
    """The mixture-of-experts fields of ModelConfig from `{arch}.expert_*` keys (none: dense)."""
    count = int(meta.get(f"{arch}.expert_count") or 0)
    if not count:
        return {}
    inter = meta.get(f"{arch}.expert_feed_forward_length") or need("feed_forward_length")
    norm = meta.get(f"{arch}.expert_weights_norm", _NORM_TOPK.get(ours, True))
    return {"num_experts": count, "experts_per_token": int(need("expert_used_count")),
            "expert_intermediate_size": int(inter), "norm_topk_prob": bool(norm),
            "shared_expert_intermediate_size": int(meta.get(f"{arch}.expert_shared_feed_forward_length") or 0)}


def _kv_heads(value: int | list[int]) -> int:
    if isinstance(value, list):  # per-layer list: only uniform values are supported
        if len(set(value)) != 1:
            raise UnsupportedModel(f"per-layer KV head counts {sorted(set(value))} are not supported")
        value = value[0]
    return int(value)


def _decimal(value: float) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07),
    i.e. the value in the original config.json."""
    return float(str(np.float32(value)))


def hf_name(gguf_name: str, arch: str = "llama") -> str:
    """HF parameter name for a GGUF tensor name; UnsupportedModel for tensors we do not implement."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    names = {**_BLOCK_NAMES, **_PHI3_NAMES} if arch == "phi3" else \
        {**_BLOCK_NAMES, **gemma.GGUF_NORMS} if arch in gemma.PATTERN else _BLOCK_NAMES
    names = {**names, **_MOE_NAMES, **{k: f"mlp.experts.{{}}.{v}" for k, v in _EXPERT_NAMES.items()}}
    if match is None or match.group(2) not in names:
        raise UnsupportedModel(f"GGUF tensor {gguf_name!r} is not part of the supported "
                               "Llama/Mistral/Qwen/Phi-3/mixture-of-experts layout")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{names[part]}.{kind}"  # (experts: "{}" where the expert's index goes)


def unpermute_rope_rows(w: Weight, n_heads: int) -> Weight:
    """Undo llama.cpp's Q/K row permutation: per head, rows (2 halves x d/2) were interleaved.

    w: [n_heads * head_dim, ...] (weight or bias). The converter did
    reshape(n, 2, d/2, ...).swapaxes(1, 2); the inverse swaps the same axes back.
    """
    if isinstance(w, (QuantMatrix, LazyQuant)):  # a row permutation: the same one on q and the group params
        return layout_rows(w, unpermute_rope_rows(torch.arange(w.shape[0]), n_heads))
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


def _torch_shape(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _load_weights(reader: GGUFFile, config: ModelConfig, dtype: torch.dtype,
                  native: bool) -> dict[str, Weight]:
    tensors = [t for t in reader.tensors if t.name != _ROPE_FREQS and t.name not in _LONGROPE]
    names = [hf_name(t.name, config.arch) for t in tensors]  # validate names before the slow part
    # (threads do not help: gguf's numpy dequantization holds the GIL most of the time)
    weights: dict[str, Weight] = {}
    for name, t in zip(names, tensors):
        value = LazyQuant(t, source=str(reader.path), release=reader.release) if native and _keeps_quant(t) else _dequantize(t, dtype)
        if "{}" in name:  # [experts, out, in]: one matrix per expert
            rows = value.shape[0] // config.num_experts
            for j in range(config.num_experts):
                weights[name.format(j)] = layout_rows(value, slice(j * rows, (j + 1) * rows))
        elif name.endswith("shared_expert_gate.weight"):  # ([hidden] in the file)
            weights[name] = value.reshape(1, -1) if isinstance(value, torch.Tensor) else value
        else:
            weights[name] = value
    if config.arch in PERMUTED_ARCHS:
        for name in list(weights):
            if ".q_proj." in name:
                weights[name] = unpermute_rope_rows(weights[name], config.num_heads)
            elif ".k_proj." in name:
                weights[name] = unpermute_rope_rows(weights[name], config.num_kv_heads)
    return to_model_layout(weights, config)


def _longrope(reader: GGUFFile) -> dict[str, list[float]]:
    """Phi-3's rope_factors_long / _short values ({"long": [...], "short": [...]}), or {}."""
    return {t.name.split("_")[2].split(".")[0]: _dequantize(t, torch.float32).flatten().tolist()
            for t in reader.tensors if t.name in _LONGROPE}


def _rope_freqs(reader: GGUFFile) -> list[float] | None:
    """The values of rope_freqs.weight (llama.cpp's per-frequency RoPE divisors), or None."""
    found = [t for t in reader.tensors if t.name == _ROPE_FREQS]
    return _dequantize(found[0], torch.float32).flatten().tolist() if found else None


def _keeps_quant(tensor: Any) -> bool:
    return len(tensor.shape) in (2, 3) and gguf_quant.supported(tensor.tensor_type)


def _dequantize(tensor: Any, dtype: torch.dtype) -> torch.Tensor:
    try:
        with np.errstate(invalid="ignore", over="ignore"):  # (damage is reported below)
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise UnsupportedModel(
            f"tensor {tensor.name} uses GGML type {tensor.tensor_type.name}, which gguf cannot dequantize; "
            "use a file quantized as F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K or similar"
        ) from exc
    # own the memory (F32 tensors come back as read-only views of the memory map)
    shape = _torch_shape(tensor)  # (experts stacked as rows: [experts * out, in])
    array = np.array(array, dtype=np.float32, copy=True).reshape(-1, shape[-1]) if len(shape) == 3 \
        else np.array(array, dtype=np.float32, copy=True).reshape(shape)
    check_finite(tensor, array, "weights")
    return torch.from_numpy(array).to(dtype)
