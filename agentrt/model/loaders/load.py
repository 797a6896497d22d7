"""load_model: a name, GGUF file or HF directory -> a ready DecoderModel with its tokenizer."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from agentrt.checks import check_bool
from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.kernels.backends import BACKENDS, get_backend
from agentrt.model import device_quant
from agentrt.model.config import ModelConfig
from agentrt.model.decoder import DecoderModel
from agentrt.model.fused import PATHS
from agentrt.model.loaders.files import ModelFiles, resolve_source
from agentrt.model.loaders.gguf import load_gguf
from agentrt.model.loaders.hf import load_hf_dir
from agentrt.model.quant import QUANT_MODES, resolve_mode
from agentrt.model.quant import quantize as apply_quant
from agentrt.model.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16}

DEFAULT_MODEL = "smollm2-135m"
KV_DTYPES = {"auto": None, "float32": torch.float32, "float16": torch.float16, "int8": torch.int8}


def load_files(name_or_path: str | os.PathLike[str], dtype: torch.dtype = torch.float32, native: bool = False) -> ModelFiles:
    """Load config, weights (as `dtype`; a GGUF's quantized matrices kept quantized with
    `native=True`) and tokenizer from any supported source (model/loaders/files.py::resolve_source)."""
    path = resolve_source(name_or_path)
    return load_hf_dir(path, dtype) if path.is_dir() else load_gguf(path, dtype, native)


@dataclass(frozen=True)
class LoadedModel:
    model: DecoderModel
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


def resolve_kv_dtype(kv_dtype: str, model: DecoderModel, quantized: bool) -> torch.dtype:
    """The KV store's element type: "auto" = float16 for quantized weights on the CPU kernels
    (half the bytes a decode step reads per cached token, and twice the tokens per GiB, as
    llama.cpp's default f16 cache), else the model's dtype (fp32 stays the accuracy reference)."""
    chosen = KV_DTYPES[kv_dtype]  # (None: "auto")
    if chosen is not None:
        return chosen
    cpu = model.norm.device.type == "cpu"
    return torch.float16 if quantized and cpu and model.dtype == torch.float32 and native.available() else model.dtype


def _check_args(source, kernels, device, quantize, forward, kv_dtype="auto") -> None:
    """load_model's arguments, checked before any file is read (ConfigError)."""
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source.strip():
        raise ConfigError(f"source must be an embedded model name (e.g. {DEFAULT_MODEL!r}), a .gguf path or a "
                          f"Hugging Face directory (str or Path), got {source!r}")
    for name, value, choices in (("quantize", quantize, QUANT_MODES), ("forward", forward, PATHS),
                                 ("kernels", kernels, BACKENDS), ("kv_dtype", kv_dtype, tuple(KV_DTYPES))):
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{name}={value!r} is not supported; choose one of {choices}")
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be a str such as 'cpu' or 'cuda', or a torch.device; got {device!r}")
    try:
        torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ConfigError(f"device={device!r} is not a torch device; use 'cpu' or 'cuda'") from None


def load_model(source: str | os.PathLike = DEFAULT_MODEL, dtype: str | torch.dtype = "float32",
               kernels: str = "auto", device: str = "cpu", quantize: str = "auto",
               forward: str = "fused", kv_dtype: str = "auto", batch_invariant: bool = True) -> LoadedModel:
    """Load weights and tokenizer from `source`: "smollm2-135m" (the embedded default), a
    .gguf file, or a Hugging Face directory (config.json + *.safetensors + tokenizer.json).

    quantize: "none" (fp32/bf16 dense, the accuracy reference), "native" (a GGUF's quantized
    matrices kept as they are, never dequantized; dense ones stay dense: on the CPU in float32
    (model/quant.py), on a GPU as packed planes its triton kernels read (model/device_quant.py)),
    "int8" (CPU only: every linear layer quantized per group of 32), "auto" (the default:
    "native" for a GGUF on a GPU, or on CPU float32 when the compiled kernels are available,
    else "none").
    forward: "fused" (compiled CPU kernels where available, else eager) or "eager" (torch
    reference); an engine can override it per step (EngineConfig.forward_path).
    kv_dtype: the KV cache's element type, "float32", "float16" (CPU: the compiled kernels and the
    torch reference read it in float32), "int8" (CPU only: each token's head quantized with its
    own scale, about half float16's bytes per token; tests/test_kv_int8.py holds its accuracy
    oracle) or "auto" (the default: float16 with quantized weights on the CPU kernels, else the
    model's dtype).
    batch_invariant: True (the default): on the fused path with quantized weights, a sequence's
    logits do not depend on what the prefix cache held, how its prefill was chunked, what else
    was batched with it or speculation (greedy output is the same however the work was cut);
    False lets long prefill chunks attend through torch's SDPA (a few % faster at 8k-token
    contexts, see model/fused.py). On a GPU, True runs every GEMM through triton tiles that do
    not depend on the batch's rows (kernels/triton_quant.py, bf16 weights included) and every
    query token's attention with a fixed split (kernels/triton_attention.py); False lets cuBLAS
    and SDPA choose by shape."""
    _check_args(source, kernels, device, quantize, forward, kv_dtype)
    check_bool("load_model batch_invariant", batch_invariant)
    dt = resolve_dtype(dtype)
    cuda = torch.device(device).type == "cuda"
    mode = resolve_mode(quantize, gguf=not resolve_source(source).is_dir(),
                        cpu_fp32=dt == torch.float32 and torch.device(device).type == "cpu", cuda=cuda)
    files = load_files(source, dt, native=mode == "native")
    tokenizer, config, source = files.tokenizer, files.config, files.source
    model = DecoderModel(files.config, dt, get_backend(kernels, device))
    model.device_quant = mode == "native" and cuda  # (packed planes for the GPU's kernels)
    model.load_hf_weights(files.weights)
    del files  # (the unpacked matrices; the model holds the packed ones)
    apply_quant(model, "int8" if mode == "int8" else "none")  # (native: loaded quantized)
    model.forward_path, model.batch_invariant = forward, batch_invariant
    model.eval()
    model = model.to(device)
    device_quant.place(model, batch_invariant)
    model.kv_dtype = resolve_kv_dtype(kv_dtype, model, quantized=mode != "none")
    if model.kv_dtype == torch.int8 and torch.device(device).type != "cpu":
        raise ConfigError("kv_dtype='int8' runs on the CPU kernels only; use 'float16' on a GPU")
    return LoadedModel(model, tokenizer, config, source)
