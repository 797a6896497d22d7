"""Load a Hugging Face model directory: config.json, *.safetensors, tokenizer.json (+ tokenizer_config.json).

Weight names are already HF names. A tied model (tie_word_embeddings) is returned without
`lm_head.weight`, like a tied GGUF, even when the file happens to contain a copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from agentrt.errors import ConfigError, CorruptModelFile, ModelNotFound, TokenizerError, UnsupportedModel
from agentrt.model.config import ModelConfig, window_fields
from agentrt.model.loaders import gemma
from agentrt.model.loaders.files import ModelFiles, check_dtype, check_weights
from agentrt.model.loaders.layouts import to_model_layout
from agentrt.model.rope import rope_from_hf
from agentrt.model.tokenizer import Tokenizer, end_of_turn_ids

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM",
                  "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}


def load_hf_dir(path: str | Path, dtype: torch.dtype = torch.float32) -> ModelFiles:
    """Read a Llama/Mistral/Qwen2/Qwen3 checkpoint directory; tokenizer is None when it has no tokenizer.json."""
    check_dtype(dtype)
    path = Path(path)
    if not path.is_dir():
        raise ModelNotFound(f"model directory {path} does not exist")
    raw = _read_json(path / "config.json", required=True)
    config = config_from_hf(raw)
    weights = to_model_layout(_load_weights(path, dtype), config)
    if config.arch in gemma.PATTERN:
        gemma.add_one_to_norms(weights)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    check_weights(config, weights, str(path))
    return ModelFiles(config=config, weights=weights, tokenizer=load_hf_tokenizer(path, raw), source=str(path))


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a transformers config.json dict (v4 or v5 layout)."""
    model_type = _check_architecture(raw)
    _check_unsupported(raw, model_type)
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        arch = gemma.HF_TYPES.get(model_type, model_type)
        rope, local_theta = gemma.hf_rope(raw, arch) if arch in gemma.PATTERN else \
            (raw.get("rope_parameters") or raw.get("rope_scaling") or {}, 0.0)
        theta = float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        max_pos = int(raw.get("max_position_embeddings", 2048))
        partial = float(raw.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
        rotary = int(head_dim * partial)
        factors, attention = rope_from_hf(rope, rotary, theta, max_pos)
        family = gemma.hf_fields(raw, arch, local_theta) if arch in gemma.PATTERN else \
            {"qk_norm": model_type in ("qwen3", "qwen3_moe", "olmoe")}
        return ModelConfig(
            arch=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rope_theta=theta,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", arch in gemma.PATTERN)),
            attention_bias=model_type == "qwen2" or (model_type == "qwen2_moe" and raw.get("qkv_bias", True)),
            qk_norm_span="all" if model_type == "olmoe" else "head",
            rope_freq_factors=factors,
            rope_attention_factor=attention,
            rotary_dim=rotary if rotary != head_dim else None,
            **_experts(raw, model_type),
            **window_fields(*_sliding_window(raw, arch, max_pos)),
            **family,
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):  # (a ValueError too: the sliding-window check)
            raise
        raise CorruptModelFile(f"config.json is missing or has a bad value for {exc}; re-save the model") from exc


def _check_architecture(raw: dict[str, Any]) -> str:
    model_type = raw.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise UnsupportedModel(
            f"model_type {model_type!r} is not supported; supported: {', '.join(_ARCHITECTURES)}"
        )
    archs = raw.get("architectures") or [_ARCHITECTURES[model_type]]
    if _ARCHITECTURES[model_type] not in archs:
        raise UnsupportedModel(f"architectures {archs} are not supported; expected {_ARCHITECTURES[model_type]}")
    return model_type


def _check_unsupported(raw: dict[str, Any], model_type: str) -> None:
    if model_type in ("llama", "mistral", "phi3") and (raw.get("attention_bias") or raw.get("mlp_bias")):
        raise UnsupportedModel(f"{model_type} checkpoints with attention/MLP biases are not supported")
    if model_type in ("qwen3", "qwen3_moe", "olmoe") and raw.get("attention_bias"):
        raise UnsupportedModel(f"{model_type} checkpoints with attention biases (q/k/v/o) are not supported")
    if model_type in ("qwen3_moe", "qwen2_moe") and (int(raw.get("decoder_sparse_step") or 1) != 1
                                                    or raw.get("mlp_only_layers")):
        raise UnsupportedModel(f"{model_type} checkpoints with dense layers (decoder_sparse_step != 1 or "
                               "mlp_only_layers) are not supported; every layer must be a mixture of experts")
    if model_type == "olmoe" and raw.get("clip_qkv") is not None:
        raise UnsupportedModel("OLMoE checkpoints with clip_qkv are not supported")


def _experts(raw: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The mixture-of-experts fields of ModelConfig (none for a dense model)."""
    if model_type not in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe"):
        return {}
    count = raw.get("num_local_experts") or raw.get("num_experts")  # (v5 writes num_local_experts)
    inter = raw.get("moe_intermediate_size") if model_type in ("qwen3_moe", "qwen2_moe") else raw.get("intermediate_size")
    norm = True if model_type == "mixtral" else bool(raw.get("norm_topk_prob", False))
    if count is None or inter is None:
        raise CorruptModelFile(f"a {model_type} config.json lacks its number of experts or their intermediate size")
    return {"num_experts": int(count), "experts_per_token": int(raw["num_experts_per_tok"]),
            "expert_intermediate_size": int(inter), "norm_topk_prob": norm,
            "shared_expert_intermediate_size": int(raw.get("shared_expert_intermediate_size") or 0)}


def _sliding_window(raw: dict[str, Any], model_type: str, context: int) -> tuple:
    """(window, context, which layers slide: None = all): window_fields' arguments. Mistral, Mixtral and Phi-3 apply
    `sliding_window` to every layer; Qwen2/3 only with use_sliding_window, on the layers v5's
    layer_types marks "sliding_attention" (v4: from layer max_window_layers on)."""
    window = raw.get("sliding_window")
    if model_type in gemma.PATTERN:
        n = int(raw["num_hidden_layers"])
        return window, context, gemma.sliding_layers(model_type, n, raw.get("layer_types"))
    if model_type in ("mistral", "phi3", "mixtral") or window is None:
        return window, context, None
    if not raw.get("use_sliding_window"):
        return None, context, None
    if raw.get("layer_types"):
        return window, context, tuple(t == "sliding_attention" for t in raw["layer_types"])
    first = int(raw.get("max_window_layers") or 0)
    return window, context, tuple(i >= first for i in range(int(raw["num_hidden_layers"])))


def _load_weights(path: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(
            f"{path} has no *.safetensors files; re-save with save_pretrained(safe_serialization=True)"
        )
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            part = load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CorruptModelFile(f"{file}: unreadable safetensors file ({exc}); re-download it") from exc
        weights.update({name: t.to(dtype) for name, t in part.items()})
    return weights


def load_hf_tokenizer(path: Path, raw_config: dict[str, Any] | None = None) -> Tokenizer | None:
    """Tokenizer from tokenizer.json (+ tokenizer_config.json, generation_config.json); None if absent."""
    if not (path / "tokenizer.json").is_file():
        return None
    try:
        backend = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise TokenizerError(f"{path / 'tokenizer.json'} cannot be read ({exc}); re-save the tokenizer") from exc
    tok_cfg = _read_json(path / "tokenizer_config.json")
    gen_cfg = _read_json(path / "generation_config.json")

    def token_id(key: str) -> int | None:
        value = tok_cfg.get(key)
        content = value.get("content") if isinstance(value, dict) else value
        return backend.token_to_id(content) if isinstance(content, str) else None

    declared = [token_id("eos_token")]
    for cfg in (gen_cfg, raw_config or {}):
        eos = cfg.get("eos_token_id")
        declared += eos if isinstance(eos, list) else [eos]
    return Tokenizer(
        backend,
        bos_token_id=token_id("bos_token"),
        eos_token_ids=end_of_turn_ids(backend, declared),
        pad_token_id=token_id("pad_token"),
        chat_template=_chat_template(path, tok_cfg),
        add_bos_token=bool(tok_cfg.get("add_bos_token", False)),
    )


def _chat_template(path: Path, tok_cfg: dict[str, Any]) -> str | None:
    """chat_template.jinja (transformers v5), else tokenizer_config's (str or list of named ones)."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tok_cfg.get("chat_template") or _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def _read_json(file: Path, *, required: bool = False) -> dict[str, Any]:
    if not file.is_file():
        if required:
            raise ModelNotFound(f"{file} does not exist; a Hugging Face model directory needs it")
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptModelFile(f"{file} is not valid JSON ({exc}); re-save it") from exc
    if not isinstance(data, dict):
        raise CorruptModelFile(f"{file} must hold a JSON object")
    return data
