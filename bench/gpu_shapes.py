"""Random-weight models of named shapes, built on the device (an offline GPU host has no model
files: bench/gpu_pack.py carries the embedded tokenizer and the SmolLM2 config instead).

    smol135m  the embedded SmolLM2-135M's shape          (576 hidden, 30 layers, 9/3 heads)
    llama1b   a Llama-3.2-1B-like shape                  (2048 hidden, 16 layers, 32/8 heads, MLP 8192)
    llama8b   the Llama-3-8B shape                       (4096 hidden, 32 layers, 32/8 heads, MLP 14336)

`hf_model` makes a transformers model (the peer; its weights feed ours), `agentrt_model` the same
weights in agentrt's model, `random_agentrt_model` agentrt's alone (the 8B shape: no peer copy),
`random_q4k_model` agentrt's over random Q4_K_M-like packed planes (Q4_K layers, a Q6_K head and
Q4_K embedding: what a desktop user's GGUF holds). `invariant`: load_model's batch_invariant
(model/device_quant.place): False, cuBLAS and SDPA by shape; True, the fixed-tile kernels."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agentrt.kernels.backends import get_backend
from agentrt.model import device_quant
from agentrt.model.decoder import DecoderModel
from agentrt.model.loaders.hf import config_from_hf, load_hf_tokenizer
from agentrt.model.loaders.load import LoadedModel

SHAPES = {
    "smol135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3),
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, tie_word_embeddings=True),
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, tie_word_embeddings=False, max_position_embeddings=8192),
}


def raw_config(pack: Path, shape: str) -> dict:
    return {**json.loads((pack / "config.json").read_text()), **SHAPES[shape]}


def hf_model(pack: Path, shape: str, device: str, dtype: torch.dtype, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**raw_config(pack, shape)))
    return model.to(dtype).eval()


def _wrap(model: DecoderModel, pack: Path, raw: dict, invariant: bool = False) -> LoadedModel:
    model.eval()
    device_quant.place(model, invariant)
    model.kv_dtype = model.dtype
    return LoadedModel(model, load_hf_tokenizer(pack, raw), model.cfg, f"random:{raw.get('hidden_size')}")


def agentrt_model(pack: Path, shape: str, hf, device: str, dtype: torch.dtype, invariant: bool = False) -> LoadedModel:
    """agentrt's model over the transformers model's weights (the same numbers)."""
    raw = raw_config(pack, shape)
    with torch.device(device):
        model = DecoderModel(config_from_hf(raw), dtype, get_backend("auto", device))
    model.load_hf_weights(hf.state_dict())
    return _wrap(model, pack, raw, invariant)


def random_planes(n: int, k: int, fmt: str, device: str) -> device_quant.DeviceWeight:
    """A random [n, k] matrix in `fmt` ("Q4_K" or "Q6_K") packed as the GPU keeps a GGUF's, made on
    the device (sub-scales and mins kept small so activations stay finite)."""
    g = torch.Generator(device=device).manual_seed(n * 7 + k)
    u8 = lambda *s, hi=256: torch.randint(0, hi, s, dtype=torch.uint8, device=device, generator=g)  # noqa: E731
    f16 = lambda *s: (torch.rand(*s, device=device, generator=g) * 2e-3).half()  # noqa: E731
    if fmt == "Q6_K":
        planes = {"lo": u8(n, k // 2), "hi": u8(n, k // 4), "sd": f16(n, k // 256),
                  "sc": (u8(n, k // 16, hi=64).to(torch.int16) - 32).to(torch.int8)}
        return device_quant.DeviceWeight(planes, fmt, 6, 16, 32, n, k)
    planes = {"lo": u8(n, k // 2), "sd": f16(n, k // 256), "sc": u8(n, k // 32, hi=64),
              "md": f16(n, k // 256), "mc": u8(n, k // 32, hi=64)}
    return device_quant.DeviceWeight(planes, fmt, 4, 32, 0, n, k)


def random_q4k_model(pack: Path, shape: str, device: str, dtype: torch.dtype, invariant: bool = False) -> LoadedModel:
    """The shape over random packed planes: every block's layers Q4_K, the head Q6_K, the
    embedding Q4_K (llama.cpp's Q4_K_M keeps a few layers in Q6_K too; a floor, not a file)."""
    raw = raw_config(pack, shape)
    with torch.device(device):  # (uninitialized dense layers, each replaced and freed below)
        model = DecoderModel(config_from_hf(raw), dtype, get_backend("auto", device))
    cfg = model.cfg
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * d
    for blk in model.blocks:
        blk.attn.qkv = device_quant.DeviceQLinear([random_planes(qkv, h, "Q4_K", device)])
        blk.attn.o = device_quant.DeviceQLinear([random_planes(h, cfg.num_heads * d, "Q4_K", device)])
        blk.mlp.gate_up = device_quant.DeviceQLinear([random_planes(2 * inter, h, "Q4_K", device)])
        blk.mlp.down = device_quant.DeviceQLinear([random_planes(h, inter, "Q4_K", device)])
    model.embed = device_quant.DeviceQEmbedding(random_planes(cfg.vocab_size, h, "Q4_K", device), dtype)
    model.lm_head = device_quant.DeviceQLinear([random_planes(cfg.vocab_size, h, "Q6_K", device)])
    return _wrap(model, pack, raw, invariant)


def random_agentrt_model(pack: Path, shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> LoadedModel:
    """agentrt's model with random weights (std 0.02; norms 1), made on the device."""
    raw = raw_config(pack, shape)
    torch.manual_seed(seed)
    with torch.device(device), torch.no_grad():
        model = DecoderModel(config_from_hf(raw), dtype, get_backend("auto", device))
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02)
    return _wrap(model, pack, raw)
