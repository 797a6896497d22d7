"""The one decoder every supported family runs on, Llama-shaped (Llama, SmolLM2, Mistral, Qwen2,
Qwen3, Phi-3, Gemma; mixture-of-experts MLPs for Qwen3-MoE, Mixtral and OLMoE, model/moe.py) over
a paged KV cache.

One forward runs a flattened varlen batch: many sequences, each with some new tokens (a
prefill chunk or one decode token, or decode + draft tokens), mixed in one call. Weights use
Hugging Face names on load; q/k/v and gate/up are fused into one matmul each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from agentrt.errors import ModelLoadError
from agentrt.kernels.backends import KernelBackend, get_backend
from agentrt.kernels.base import SHORT_QUERIES, AttentionMeta
from agentrt.kernels.packing import QuantMatrix, pack
from agentrt.kv.store import KVStore
from agentrt.model import device_quant, fused
from agentrt.model.config import ModelConfig
from agentrt.model.dense import Dense
from agentrt.model.loaders.lazy import LazyQuant, Weight, materialize
from agentrt.model.moe import MoE
from agentrt.model.quant import HEAD_REFINE, QEmbedding, QLinear, linear_from
from agentrt.model.rope import RopeTable


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, layer: int = 0):
        super().__init__()
        self.window = cfg.window(layer)  # sliding window (0: full causal attention)
        self.local_rope = cfg.local_rope(layer)  # turns by DecoderModel.rope_local (Gemma 3's local layers)
        self.softcap = cfg.attn_softcap  # scores -> softcap * tanh(scores / softcap) (Gemma 2; 0: none)
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        out = (self.h + 2 * self.hkv) * self.d
        self.qkv = Dense(cfg.hidden_size, out, cfg.attention_bias, dtype)
        self.o = Dense(self.h * self.d, cfg.hidden_size, False, dtype)
        self.scale = cfg.attention_scale
        self.eps = cfg.rms_norm_eps
        # RMSNorm weights of q and k, applied before RoPE: per head ([head_dim], Qwen3) or over the
        # whole projection ([heads * head_dim], OLMoE: `norm_all`); None elsewhere
        self.norm_all = cfg.qk_norm_span == "all"
        qn, kn = (self.h * self.d, self.hkv * self.d) if self.norm_all else (self.d, self.d)
        self.q_norm = nn.Parameter(torch.ones(qn, dtype=dtype)) if cfg.qk_norm else None
        self.k_norm = nn.Parameter(torch.ones(kn, dtype=dtype)) if cfg.qk_norm else None

    def forward(self, x, rot, layer: int, kv: KVStore, meta: AttentionMeta, ops, lora=None):
        """rot: (cos, sin) of the global and of the local RoPE table at the batch's positions.
        lora: the step's LoraStep (adapters/apply.py), or None."""
        t = x.shape[0]
        cos, sin = rot[1] if self.local_rope else rot[0]
        qkv = self.qkv(x)
        if lora is not None:
            lora.add(layer, "qkv", x, qkv)
        q, k, v = qkv.split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], -1)
        if self.norm_all:
            q, k = ops.rms_norm(q, self.q_norm, self.eps), ops.rms_norm(k, self.k_norm, self.eps)
        q, k = q.reshape(t, self.h, self.d), k.reshape(t, self.hkv, self.d)
        if self.q_norm is not None and not self.norm_all:
            q, k = ops.rms_norm(q, self.q_norm, self.eps), ops.rms_norm(k, self.k_norm, self.eps)
        q = ops.rope(q, cos, sin)  # [T, H, D]
        k = ops.rope(k, cos, sin)  # [T, Hkv, D]
        meta = meta.for_layer(kv.is_local(layer))  # (a sliding-window layer's own pages: kv/window.py)
        ops.store_kv(kv.k[layer], kv.v[layer], k, v.view(t, self.hkv, self.d), meta.slot_mapping)
        a = ops.paged_attention(q, kv.k[layer], kv.v[layer], meta, self.scale, self.window, self.softcap)
        a = a.reshape(t, self.h * self.d)
        out = self.o(a)
        if lora is not None:
            lora.add(layer, "o", a, out)
        return out


class MLP(nn.Module):
    experts = shared = None  # (a dense MLP: no routed or shared experts, as a MoE's)

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gelu = cfg.mlp_act == "gelu_tanh"  # GeGLU (Gemma), else SwiGLU
        self.gate_up = Dense(cfg.hidden_size, 2 * self.inter, False, dtype)
        self.down = Dense(self.inter, cfg.hidden_size, False, dtype)

    def act(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return (nn.functional.gelu(gate, approximate="tanh") if self.gelu else nn.functional.silu(gate)) * up

    def forward(self, x, lora=None, layer: int = 0):
        gu = self.gate_up(x)
        if lora is not None:
            lora.add(layer, "gate_up", x, gu)
        act = self.act(*gu.split(self.inter, -1))
        out = self.down(act)
        if lora is not None:
            lora.add(layer, "down", act, out)
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, layer: int = 0):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.attn_norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dtype))
        self.mlp_norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dtype))
        self.attn = Attention(cfg, dtype, layer)
        self.mlp = MoE(cfg, dtype) if cfg.is_moe else MLP(cfg, dtype)
        # Gemma: norms of the attention's and the MLP's outputs too, before the residual adds
        sandwich = cfg.sandwich_norms
        self.attn_post_norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dtype)) if sandwich else None
        self.mlp_post_norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dtype)) if sandwich else None

    def forward(self, x, rot, layer, kv, meta, ops, lora=None):
        h = self.attn(ops.rms_norm(x, self.attn_norm, self.eps), rot, layer, kv, meta, ops, lora)
        x = x + (h if self.attn_post_norm is None else ops.rms_norm(h, self.attn_post_norm, self.eps))
        h = ops.rms_norm(x, self.mlp_norm, self.eps)
        h = self.mlp(h) if lora is None or isinstance(self.mlp, MoE) else self.mlp(h, lora, layer)
        return x + (h if self.mlp_post_norm is None else ops.rms_norm(h, self.mlp_post_norm, self.eps))


class DecoderModel(nn.Module):
    """forward(input_ids [T], positions [T], kv, meta, logits_rows [L]) -> logits [L, V] fp32."""

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
                 kernels: KernelBackend | None = None):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.kv_dtype = dtype  # the KV store's element type (load_model may choose float16)
        self.ops = kernels or get_backend("auto", "cpu")
        # (no random init: the weights are loaded next; native quantization replaces it unwritten)
        # nn.Embedding until a quantized table replaces it (QEmbedding, DeviceQEmbedding)
        self.embed: nn.Module = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(
            cfg.vocab_size, cfg.hidden_size, dtype=dtype), _freeze=True)
        self.blocks = nn.ModuleList(Block(cfg, dtype, i) for i in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, dtype=dtype))
        # tied embeddings: the head keeps its own [in, out] copy (faster layout, see Dense)
        self.lm_head: nn.Module = Dense(cfg.hidden_size, cfg.vocab_size, False, dtype)  # (or QLinear, DeviceQLinear)
        self.rope = RopeTable(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_freq_factors,
                              cfg.rope_attention_factor, cfg.rotary_dim)
        # the sliding-window layers' own table (Gemma 3: base 10,000, unscaled), or the same one
        self.rope_local = RopeTable(cfg.head_dim, cfg.max_position_embeddings, cfg.local_rope_theta) \
            if cfg.local_rope_theta else self.rope
        self.forward_path = "fused"  # "fused" runs only where the compiled kernels are available
        # every row computed in an order of its own (model/fused.py): output independent of batching
        self.batch_invariant = True
        # what the fused forward (model/fused.py) keeps per model: the layers' native description
        # and the KV store's pointers, each rebuilt there when what it describes changes
        self.fused_cache: dict[str, Any] = {}
        # a GGUF's quantized matrices kept packed for a GPU (model/device_quant.py), set by load_model
        self.device_quant = False

    @property
    def short_limit(self) -> int | None:
        """build_batch's short_limit for this model: every row token by token when its kernels
        run batch-invariant (a fixed attention split), else SHORT_QUERIES."""
        return None if self.ops.invariant_chunk else SHORT_QUERIES

    def layers(self) -> list[Block]:
        """The decoder blocks, typed (nn.ModuleList holds plain Modules)."""
        return [b for b in self.blocks if isinstance(b, Block)]

    @property
    def device(self) -> torch.device:
        """Where the weights live: the KV store and every batch go there too."""
        return self.norm.device

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: KVStore,
                meta: AttentionMeta, logits_rows: torch.Tensor | None = None,
                path: str | None = None, lora=None) -> torch.Tensor:
        """`path`: "fused" (compiled CPU kernels, one call per op of a layer) or "eager" (the
        torch reference); None = the model's default `forward_path`. `lora`: the step's
        LoraStep (adapters/apply.py: the rows that run an adapter), or None."""
        if fused.use_fused(self, path or self.forward_path):
            return fused.forward(self, input_ids, positions, kv, meta, logits_rows, lora)
        return self.forward_eager(input_ids, positions, kv, meta, logits_rows, lora)

    def forward_eager(self, input_ids, positions, kv, meta, logits_rows=None, lora=None) -> torch.Tensor:
        x = self.embed(input_ids)  # [T, hidden]
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        rot = tuple((r.cos[positions], r.sin[positions]) for r in (self.rope, self.rope_local))  # [T, D]
        for i, block in enumerate(self.blocks):
            x = block(x, rot, i, kv, meta, self.ops, lora)
        if logits_rows is not None:
            x = x[logits_rows]
        x = self.ops.rms_norm(x, self.norm, self.cfg.rms_norm_eps)
        return fused.softcap_logits(self.lm_head(x).float(), self.cfg.final_softcap)  # [L, V]

    def load_hf_weights(self, weights: Mapping[str, Weight]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up."""
        w = {k: v if isinstance(v, (QuantMatrix, LazyQuant)) else v.to(self.dtype) for k, v in weights.items()}
        try:
            with torch.no_grad():
                self._copy_all(w)
        except KeyError as e:
            raise ModelLoadError(f"weights are missing tensor {e.args[0]!r}") from e

    def _copy_all(self, w: dict) -> None:
        emb = w["model.embed_tokens.weight"]
        if self.device_quant and isinstance(emb, LazyQuant):
            self._copy_device_embedding(w, emb)
        else:
            self._copy_embedding(w, materialize(emb))
        self.norm.copy_(w["model.norm.weight"])
        for i, blk in enumerate(self.layers()):
            self._copy_block(blk, w, f"model.layers.{i}.")

    def _copy_device_embedding(self, w: dict, emb: LazyQuant) -> None:
        """The embedding packed for a GPU; a tied head reads the same planes."""
        table = device_quant.from_lazy(emb)
        self.embed = device_quant.DeviceQEmbedding(table, self.dtype)
        if self.cfg.tie_word_embeddings or "lm_head.weight" not in w:
            self.lm_head = device_quant.DeviceQLinear([table])
        else:
            self._set_linear(self, "lm_head", [w["lm_head.weight"]])

    def _copy_embedding(self, w: dict, emb) -> None:
        if isinstance(emb, QuantMatrix):
            self.embed = QEmbedding(pack(emb))
        elif isinstance(self.embed, nn.Embedding):
            self.embed.weight.copy_(emb)
        else:
            raise ModelLoadError("a float embedding table for a model whose table is already quantized")
        tied = self.cfg.tie_word_embeddings or "lm_head.weight" not in w
        if tied and isinstance(self.embed, QEmbedding):  # the head reads the same packed table
            self.lm_head = QLinear([self.embed.packed], refine=HEAD_REFINE)
        else:
            self._set_linear(self, "lm_head", [emb if tied else w["lm_head.weight"]], refine=HEAD_REFINE)

    def _copy_block(self, blk: Block, w: dict, p: str) -> None:
        att = p + "self_attn."
        blk.attn_norm.copy_(w[p + "input_layernorm.weight"])
        if blk.attn_post_norm is not None and blk.mlp_post_norm is not None:  # (sandwich_norms: Gemma's
            # post_attention_layernorm follows the attention)
            blk.attn_post_norm.copy_(w[p + "post_attention_layernorm.weight"])
            blk.mlp_norm.copy_(w[p + "pre_feedforward_layernorm.weight"])
            blk.mlp_post_norm.copy_(w[p + "post_feedforward_layernorm.weight"])
        else:
            blk.mlp_norm.copy_(w[p + "post_attention_layernorm.weight"])
        if blk.attn.q_norm is not None and blk.attn.k_norm is not None:  # (cfg.qk_norm)
            blk.attn.q_norm.copy_(w[att + "q_norm.weight"])
            blk.attn.k_norm.copy_(w[att + "k_norm.weight"])
        bias = torch.cat([w[att + f"{n}_proj.bias"] for n in "qkv"]) if self.cfg.attention_bias else None
        self._set_linear(blk.attn, "qkv", [w[att + f"{n}_proj.weight"] for n in "qkv"], bias)
        self._set_linear(blk.attn, "o", [w[att + "o_proj.weight"]])
        if isinstance(blk.mlp, MoE):
            self._copy_moe(blk.mlp, w, p + "mlp.")
            return
        self._set_linear(blk.mlp, "gate_up", [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
        self._set_linear(blk.mlp, "down", [w[p + "mlp.down_proj.weight"]])

    def _copy_moe(self, moe: MoE, w: dict, p: str) -> None:
        router = materialize(w[p + "gate.weight"])
        moe.router.copy_(router.dequantize() if isinstance(router, QuantMatrix) else router)
        experts = [(f"{p}experts.{j}.", x) for j, x in enumerate(moe.experts)]
        if moe.shared is not None and moe.shared_gate is not None:
            experts.append((p + "shared_expert.", moe.shared))
            gate = materialize(w[p + "shared_expert_gate.weight"])
            moe.shared_gate.copy_((gate.dequantize() if isinstance(gate, QuantMatrix) else gate).reshape(1, -1))
        for e, expert in experts:
            self._set_linear(expert, "gate_up", [w[e + "gate_proj.weight"], w[e + "up_proj.weight"]])
            self._set_linear(expert, "down", [w[e + "down_proj.weight"]])

    def _set_linear(self, owner: nn.Module, name: str, parts: list, bias: torch.Tensor | None = None,
                    refine: int = 0) -> None:
        """Dense parts are concatenated into the Dense layer; any quantized part makes the
        layer a QLinear (and frees the never-written dense one), or for a GPU (`device_quant`)
        a DeviceQLinear over the parts' packed planes. Lazy parts are read here."""
        if self.device_quant and any(isinstance(p, LazyQuant) for p in parts):
            setattr(owner, name, device_quant.DeviceQLinear.fused(
                [device_quant.device_weight(p, self.dtype) for p in parts], bias))
            return
        parts = [materialize(p) for p in parts]
        if any(isinstance(p, QuantMatrix) for p in parts):
            setattr(owner, name, linear_from(parts, bias, refine=refine))
        else:
            getattr(owner, name).load(torch.cat(parts) if len(parts) > 1 else parts[0], bias)
