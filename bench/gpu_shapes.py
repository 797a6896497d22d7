"""Random-weight models of named shapes, built on the device (an offline GPU host has no model
files: bench/gpu_pack.py carries the embedded tokenizer and the SmolLM2 config instead).

    smol135m  the embedded SmolLM2-135M's shape          (576 hidden, 30 layers, 9/3 heads)
    llama1b   a Llama-3.2-1B-like shape                  (2048 hidden, 16 layers, 32/8 heads, MLP 8192)
    llama8b   the Llama-3-8B shape                       (4096 hidden, 32 layers, 32/8 heads, MLP 14336)

`hf_model` makes a transformers model (the peer; its weights feed ours), `agentrt_model` the same
weights in agentrt's model, `random_agentrt_model` agentrt's alone (the 8B shape: no peer copy)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agentrt.kernels.backends import get_backend
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


def _wrap(model: DecoderModel, pack: Path, raw: dict) -> LoadedModel:
    model.eval()
    model.kv_dtype = model.dtype
    return LoadedModel(model, load_hf_tokenizer(pack, raw), model.cfg, f"random:{raw.get('hidden_size')}")


def agentrt_model(pack: Path, shape: str, hf, device: str, dtype: torch.dtype) -> LoadedModel:
    """agentrt's model over the transformers model's weights (the same numbers)."""
    raw = raw_config(pack, shape)
    with torch.device(device):
        model = DecoderModel(config_from_hf(raw), dtype, get_backend("auto", device))
    model.load_hf_weights(hf.state_dict())
    return _wrap(model, pack, raw)


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
