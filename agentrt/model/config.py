"""Model hyperparameters, independent of the file format they were read from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrt.errors import ConfigError, UnsupportedModel

SUPPORTED_ARCHS = ("llama", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only Llama-family hyperparameters.

    Weight names everywhere in agentrt follow Hugging Face's Llama/Qwen2 naming
    (`model.layers.{i}.self_attn.q_proj.weight`, ...); loaders translate to it.
    """

    arch: str  # "llama" (Llama, SmolLM2, Mistral-style) or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qkv bias (Qwen2)

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModel(
                f"architecture {self.arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)
