"""load_model: a name, GGUF file or HF directory -> a ready LlamaModel with its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrt.errors import ConfigError
from agentrt.kernels import get_backend
from agentrt.model.config import ModelConfig
from agentrt.model.files import load_files
from agentrt.model.llama import LlamaModel
from agentrt.model.quant import QUANT_MODES
from agentrt.model.quant import quantize as apply_quant
from agentrt.model.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16}

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class LoadedModel:
    model: LlamaModel
    tokenizer: Tokenizer | None
    config: ModelConfig
    source: str


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype in (torch.float32, torch.bfloat16):
            return dtype
    elif dtype in DTYPES:
        return DTYPES[dtype]
    raise ConfigError(f"dtype {dtype!r} is not supported; use 'float32' (default) or 'bfloat16'")


def load_model(source: str = DEFAULT_MODEL, dtype: str | torch.dtype = "float32",
               kernels: str = "auto", device: str = "cpu", quantize: str = "none") -> LoadedModel:
    """Load weights and tokenizer from `source`: "smollm2-135m" (the embedded default), a
    .gguf file, or a Hugging Face directory (config.json + *.safetensors + tokenizer.json).
    quantize="int8": weight-only int8 linear layers (CPU decode speed; see model/quant.py)."""
    dt = resolve_dtype(dtype)
    if quantize not in QUANT_MODES:
        raise ConfigError(f"quantize={quantize!r} is not supported; choose one of {QUANT_MODES}")
    files = load_files(source, dt)
    model = LlamaModel(files.config, dt, get_backend(kernels, device))
    model.load_hf_weights(files.weights)
    apply_quant(model, quantize)
    model.eval()
    return LoadedModel(model.to(device), files.tokenizer, files.config, files.source)
