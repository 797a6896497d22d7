"""A GGUF loaded for a GPU keeps its quantization (model/device_quant.py): every linear layer and
the embedding over packed planes, a tied head sharing the embedding's, and logits equal to the
same file's dequantized weights run dense. The layers run in torch here and, for one file, in
the triton kernel under its interpreter (tests/test_triton_quant.py tests the kernel itself)."""

from __future__ import annotations

import gguf
import pytest
import torch

CUDA = torch.cuda.is_available()

pytest.importorskip("triton")
from agentrt.errors import ConfigError  # noqa: E402
from agentrt.model import device_quant  # noqa: E402
from agentrt.model.decoder import DecoderModel  # noqa: E402
from agentrt.model.generate import prompt_logits  # noqa: E402
from agentrt.model.loaders.load import load_files, load_model  # noqa: E402
from agentrt.model.quant import resolve_mode  # noqa: E402
from tests.test_architectures import make_hf, write_gguf  # noqa: E402

Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("devq")
    hf = make_hf("llama-linear")  # (tied embeddings)
    out = {}
    for q in (Q.Q8_0, Q.Q4_0, Q.Q5_1):
        out[q] = root / f"{q.name}.gguf"
        write_gguf(out[q], hf, "llama", q)
    return out


def load_for_gpu(path) -> DecoderModel:
    """load_model's steps for device="cuda" (quantize "auto"), kept on the CPU."""
    f = load_files(path, torch.float32, native=True)
    model = DecoderModel(f.config, torch.float32)
    model.device_quant = True
    model.load_hf_weights(f.weights)
    device_quant.place(model.eval(), invariant=True)
    model.forward_path = "eager"
    return model


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q5_1], ids=lambda q: q.name)
def test_a_gguf_for_the_gpu_stays_packed_and_matches_its_dequantized_weights(files, qtype):
    model = load_for_gpu(files[qtype])
    layers = [b.attn.qkv for b in model.blocks] + [b.mlp.down for b in model.blocks] + [model.lm_head]
    assert all(isinstance(x, device_quant.DeviceQLinear) for x in layers)
    assert isinstance(model.embed, device_quant.DeviceQEmbedding)
    assert model.lm_head.parts[0] is model.embed.weight  # the tied head reads the embedding's planes
    assert all(p.fmt == qtype.name for x in layers for p in x.parts)
    dense = load_model(str(files[qtype]), quantize="none", forward="eager").model  # dequantized fp32
    packed, full = device_quant.weight_bytes(model), device_quant.weight_bytes(dense)
    assert packed < full * (0.4 if qtype == Q.Q8_0 else 0.25)  # (the dense model keeps a tied head copy)
    prompt = list(range(3, 40))
    ref = prompt_logits(dense, prompt)
    got = prompt_logits(model, prompt)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_the_kernel_runs_the_packed_model_like_torch(files):
    model = load_for_gpu(files[Q.Q4_0])
    prompt = list(range(5, 17))
    ref = prompt_logits(model, prompt)
    for m in model.modules():
        if isinstance(m, (device_quant.DeviceQLinear, device_quant.DeviceQEmbedding)):
            m.impl = "triton"
    got = prompt_logits(model, prompt)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_quantize_modes_for_a_gpu():
    assert resolve_mode("auto", gguf=True, cpu_fp32=False, cuda=True) == "native"
    assert resolve_mode("native", gguf=True, cpu_fp32=False, cuda=True) == "native"
    assert resolve_mode("auto", gguf=False, cpu_fp32=False, cuda=True) == "none"
    assert resolve_mode("none", gguf=True, cpu_fp32=False, cuda=True) == "none"
    with pytest.raises(ConfigError, match="int8.*CPU"):
        resolve_mode("int8", gguf=True, cpu_fp32=False, cuda=True)
