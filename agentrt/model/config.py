"""Model hyperparameters, independent of the file format they were read from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agentrt.errors import ConfigError, UnsupportedModel

# llama: Llama 1-3, SmolLM2; mistral: Llama's layers (full attention only); qwen2: qkv bias;
# qwen3: per-head RMSNorm on q and k before RoPE, head_dim set explicitly; phi3: Llama's layers
# with fused qkv / gate_up projections (split at load), long-RoPE, partial rotary (Phi-4-mini);
# mixture-of-experts (model/moe.py): qwen3_moe (Qwen3's attention), qwen2_moe (Qwen2's, a shared
# expert), mixtral (Llama's attention),
# olmoe (RMSNorm over the whole q and k projections)
# gemma2 / gemma3 (text): embeddings scaled by sqrt(hidden), GeGLU, norms before and after attention
# and MLP, a query scale of their own; Gemma 2 softcaps attention scores and final logits, Gemma 3
# has q/k head norms and a RoPE base of its own on its sliding-window layers
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "phi3", "qwen3_moe", "qwen2_moe", "mixtral", "olmoe",
                   "gemma2", "gemma3")
MLP_ACTS = ("silu", "gelu_tanh")
MAX_EXPERTS = 1024
QK_NORM_SPANS = ("head", "all")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder-only Llama-family hyperparameters.

    Weight names everywhere in agentrt follow Hugging Face's Llama/Qwen naming
    (`model.layers.{i}.self_attn.q_proj.weight`, ...); loaders translate to it.
    """

    arch: str  # one of SUPPORTED_ARCHS
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # may differ from hidden_size // num_heads (Qwen3)
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # qkv bias (Qwen2)
    qk_norm: bool = False  # RMSNorm over each q/k head before RoPE (Qwen3), weights [head_dim]
    # RoPE scaling as one divisor per rotary frequency ([head_dim / 2]; None = unscaled): see rope.py
    rope_freq_factors: tuple[float, ...] | None = None
    rope_attention_factor: float = 1.0  # cos and sin scaled by it (YaRN, long-RoPE): see rope.py
    # dimensions of each head that rotate (partial rotary; None: all). The loaders permute q/k so
    # that they are the pairs (i, i + head_dim/2), i < rotary_dim/2: see rope.partial_rotary_order
    rotary_dim: int | None = None
    # "head": q/k norms [head_dim] per head (Qwen3); "all": over the whole projection (OLMoE)
    qk_norm_span: str = "head"
    # mixture-of-experts (model/moe.py; 0 experts: dense MLPs): every layer's MLP is `num_experts`
    # experts of `expert_intermediate_size`, `experts_per_token` of them run per token, weighted by
    # the router's softmax over all experts, renormalised over the chosen ones if `norm_topk_prob`
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    # a shared expert every token runs, weighted by sigmoid(h . shared_gate) (Qwen2-MoE; 0: none)
    shared_expert_intermediate_size: int = 0
    # sliding-window attention: a query at position p attends keys (p - sliding_window, p] on the
    # layers `window_layers` marks (None: every layer); 0: full attention everywhere
    sliding_window: int = 0
    window_layers: tuple[bool, ...] | None = None
    local_rope_theta: float = 0.0  # RoPE base of the sliding-window layers, unscaled (0: the global table)
    # Gemma: x * embed_scale after the embedding; gate activation; norms after attention and MLP
    # too ("sandwich"); attention scale query_scale ** -0.5 (0: head_dim); tanh softcaps (0: none)
    embed_scale: float = 1.0
    mlp_act: str = "silu"
    sandwich_norms: bool = False
    query_scale: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModel(
                f"architecture {self.arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim ({self.head_dim}) must be even for rotary embeddings")
        rotary = self.rotary_dim if self.rotary_dim is not None else self.head_dim
        if rotary % 2 or not 0 < rotary <= self.head_dim:
            raise ConfigError(f"rotary_dim ({rotary}) must be even and in (0, head_dim = {self.head_dim}]")
        if self.rope_freq_factors is not None and len(self.rope_freq_factors) != rotary // 2:
            raise ConfigError(f"rope_freq_factors has {len(self.rope_freq_factors)} values; "
                              f"it needs rotary_dim / 2 = {rotary // 2}")

        if self.mlp_act not in MLP_ACTS:
            raise ConfigError(f"mlp_act {self.mlp_act!r} must be one of {MLP_ACTS}")
        if self.qk_norm_span not in QK_NORM_SPANS:
            raise ConfigError(f"qk_norm_span {self.qk_norm_span!r} must be one of {QK_NORM_SPANS}")
        if self.num_experts > MAX_EXPERTS:  # (kernels/csrc/moe.cpp routes on the stack)
            raise UnsupportedModel(f"{self.num_experts} experts per layer are not supported (at most {MAX_EXPERTS})")
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts
                                     and self.expert_intermediate_size > 0):
            raise ConfigError(f"a mixture-of-experts config needs 0 < experts_per_token ({self.experts_per_token}) "
                              f"<= num_experts ({self.num_experts}) and expert_intermediate_size > 0")

        if self.window_layers is not None and len(self.window_layers) != self.num_layers:
            raise ConfigError(f"window_layers has {len(self.window_layers)} entries for {self.num_layers} layers")

    def window(self, layer: int) -> int:
        """The keys a query of `layer` attends (0: all of them)."""
        if self.sliding_window <= 0 or (self.window_layers is not None and not self.window_layers[layer]):
            return 0
        return self.sliding_window

    @property
    def attention_scale(self) -> float:
        return (self.query_scale or self.head_dim) ** -0.5

    def local_rope(self, layer: int) -> bool:
        """Whether `layer` turns by the local RoPE table (a sliding-window layer of Gemma 3)."""
        return bool(self.local_rope_theta) and self.window(layer) > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


def window_fields(window: int | None, context: int, layers: tuple[bool, ...] | None) -> dict:
    """ModelConfig's sliding-window fields: none when no layer slides or the window covers the
    whole context (plain causal attention then)."""
    if window is None or int(window) <= 0 or int(window) >= context or (layers is not None and not any(layers)):
        return {}
    return {"sliding_window": int(window), "window_layers": None if layers is None or all(layers) else layers}
