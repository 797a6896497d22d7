"""The compiled segmented-LoRA kernel (kernels/csrc/lora.cpp) against the torch segments
(LoraStep.add_torch): every projection, several segments and adapters in one call, fp32 and bf16
adapters; a row's bits do not depend on the rest of the step; and the all-layers decoder call with
adapters gives the layer-by-layer path's logits exactly, and torch's within 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrt.adapters import LoraStep, build_adapter
from agentrt.adapters.lora import TARGETS, target_shapes
from agentrt.kernels import native
from agentrt.kv.store import KVStore
from agentrt.model import fused as fused_mod
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.config import ModelConfig
from tests.conftest import tiny_native
from tests.test_cross_cpu import dot_in_order

pytestmark = pytest.mark.skipif(not native.available(), reason="the compiled CPU kernels are not built")

# odd sizes: a dot's tail past the last 64 values, an expand's last partial block of columns
CFG = ModelConfig(arch="llama", vocab_size=50, hidden_size=200, intermediate_size=130, num_layers=3,
                  num_heads=5, num_kv_heads=1, head_dim=40)
PROJ_IN = {"qkv": 200, "o": 200, "gate_up": 200, "down": 130}
PROJ_OUT = {"qkv": 280, "o": 200, "gate_up": 260, "down": 200}


def random_adapter(cfg, name: str, seed: int, rank: int = 16, targets=tuple(TARGETS), layers=None, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    shapes = target_shapes(cfg)
    mats = {}
    for layer in layers if layers is not None else range(cfg.num_layers):
        for t in targets:
            n_in, n_out, _ = shapes[t]
            mats[(layer, t)] = (torch.randn(rank, n_in, generator=g), torch.randn(n_out, rank, generator=g), scale)
    return build_adapter(name, name, cfg, mats)


def adapters():
    return [random_adapter(CFG, "a", 1), random_adapter(CFG, "b", 2, rank=4, targets=("q_proj", "v_proj", "down_proj")),
            random_adapter(CFG, "c", 3, rank=33, layers=[1, 2])]


def segments(ads):
    a, b, c = ads
    return ((0, 5, a), (7, 8, b), (8, 20, a), (21, 23, c), (23, 24, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("proj", list(PROJ_IN))
def test_the_kernel_matches_the_torch_segments(proj, dtype):
    ads = [a.to("cpu", dtype) for a in adapters()]
    step = LoraStep(segments(ads))
    assert step.native() is not None
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, PROJ_IN[proj], generator=g)
    for layer in range(CFG.num_layers):
        y = torch.randn(24, PROJ_OUT[proj], generator=g)
        ours, ref = y.clone(), y.clone()
        step.add(layer, proj, x, ours)
        step.add_torch(layer, proj, x, ref)
        assert (ours - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
        assert not torch.equal(ours, y)  # (it did add something)
        assert torch.equal(ours[5:7], y[5:7]) and torch.equal(ours[20:21], y[20:21])  # base rows untouched


def test_strided_rows_and_a_row_alone_give_the_same_bits():
    ads = adapters()
    g = torch.Generator().manual_seed(6)
    wide = torch.randn(24, 300, generator=g)
    x = wide[:, 50:250]  # (rows with a stride other than their width)
    y = torch.randn(24, 280, generator=g)
    mixed = y.clone()
    LoraStep(segments(ads)).add(1, "qkv", x, mixed)
    for r0, r1, ad in segments(ads):
        for r in range(r0, r1):
            alone = y[r:r + 1].clone()
            LoraStep(((0, 1, ad),)).add(1, "qkv", x[r:r + 1].contiguous(), alone)
            assert torch.equal(alone[0], mixed[r])


def _forward(model, seqs, ads):
    kv = KVStore.allocate(model.cfg, 32, 16)
    chunks, page = [], 0
    for s, adapter in zip(seqs, ads):
        n = -(-len(s) // 16)
        chunks.append(SeqChunk(s, 0, list(range(page, page + n)), len(s), adapter=adapter))
        page += n
    fb = build_batch(chunks, 16)
    return model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, lora=LoraStep.of(chunks))


def test_the_all_layers_call_with_adapters_equals_layer_by_layer_and_torch(monkeypatch):
    model = tiny_native("llama")
    cfg = model.cfg
    # (a real adapter's size of delta: int8 activations round to another step past a larger one)
    x, y = random_adapter(cfg, "x", 11, scale=0.002), random_adapter(cfg, "y", 12, rank=8, scale=0.002)
    ads = [x, None, y, x]
    seqs = [[3, 9, 27], [4], [5, 6], [7]]  # (short rows: the all-layers call runs them)
    calls = []
    real = native.load().agrt_decoder_layers
    monkeypatch.setattr(native.load(), "agrt_decoder_layers", lambda *a: calls.append(a[-1]) or real(*a))
    fused = _forward(model, seqs, ads)
    assert len(calls) == 1 and calls[0] is not None  # one call, with the step's adapters
    with monkeypatch.context() as m:
        m.setattr(fused_mod, "native_layers", lambda model: None)  # layer by layer, the same kernel
        assert torch.equal(_forward(model, seqs, ads), fused)
    monkeypatch.setattr(LoraStep, "native", lambda self: None)  # the kernel's step description: none
    monkeypatch.setattr(LoraStep, "add", LoraStep.add_torch)
    by_torch = _forward(model, seqs, ads)
    assert len(calls) == 1  # (layer by layer)
    assert (fused - by_torch).abs().max().item() <= 1e-4
    plain = _forward(model, seqs, [None] * 4)
    assert torch.equal(fused[3], plain[3]) and (fused[0] - plain[0]).abs().max().item() > 1e-3  # (row 3: the base)


def _write_peft(root, cfg, dtype, seed=1, rank=4):
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for t in ("q_proj", "down_proj"):
        n_in, n_out, _ = target_shapes(cfg)[t]
        part = "self_attn" if t == "q_proj" else "mlp"
        key = f"base_model.model.model.layers.0.{part}.{t}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g).to(dtype)
        tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g).to(dtype)
    root.mkdir(parents=True)
    save_file(tensors, root / "adapter_model.safetensors")
    (root / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank}))
    return root


def test_an_adapter_keeps_its_own_precision_and_a_chosen_one_is_its_identity(tmp_path):
    from agentrt.adapters.registry import read_adapter
    from agentrt.errors import AdapterError

    model = tiny_native("llama")
    bf = read_adapter("b", _write_peft(tmp_path / "bf16", model.cfg, torch.bfloat16), model)
    f32_dir = _write_peft(tmp_path / "f32", model.cfg, torch.float32)
    f32 = read_adapter("f", f32_dir, model)
    as_bf = read_adapter("f", f32_dir, model, dtype="bfloat16")
    assert (bf.dtype, f32.dtype, as_bf.dtype) == ("bfloat16", "float32", "bfloat16")
    assert bf.nbytes * 2 == f32.nbytes == as_bf.nbytes * 2
    assert as_bf.fingerprint != f32.fingerprint  # (other numbers: other KV)
    assert LoraStep(((0, 1, bf),)).native() is not None
    with pytest.raises(AdapterError, match="dtype must be one of"):
        read_adapter("f", f32_dir, model, dtype="float16")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_sums_in_its_written_order(dtype):
    """Its order is written out, not the compiler's vector width: the same bits on every CPU kind."""
    ad = random_adapter(CFG, "a", 4, rank=5).to("cpu", dtype)
    g = torch.Generator().manual_seed(9)
    x, y = torch.randn(2, 130, generator=g), torch.randn(2, 200, generator=g)
    ours = y.clone()
    LoraStep(((0, 2, ad),)).add(2, "down", x, ours)
    (p,) = ad.layers[2]["down"]
    a, bt = p.a.float().numpy(), p.b.t().float().numpy()
    for r in range(2):
        t = [dot_in_order(a[k], x[r].numpy()) for k in range(a.shape[0])]
        acc = np.zeros(bt.shape[1], np.float32)
        for k, tk in enumerate(t):
            acc = acc + np.float32(tk) * bt[k]
        assert np.array_equal(ours[r].numpy(), y[r].numpy() + acc)
