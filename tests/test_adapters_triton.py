"""The triton segmented-LoRA kernel (kernels/triton_lora.py, the GPU path) against the torch
segments (LoraStep.add_torch): every projection, several segments and adapters (ranks 4, 16
and 33, layer subsets) in one launch, fp32 and bf16 adapters. On CPU it runs in triton's
interpreter (TRITON_INTERPRET=1, tests/conftest.py); on a GPU, natively."""

from __future__ import annotations

import pytest
import torch

from agentrt.adapters import LoraStep
from tests.test_adapters_native import CFG, PROJ_IN, PROJ_OUT, adapters, segments

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("proj", list(PROJ_IN))
def test_the_triton_kernel_matches_the_torch_segments(proj, dtype):
    ads = [a.to(DEVICE, dtype) for a in adapters()]
    step = LoraStep(segments(ads))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, PROJ_IN[proj], generator=g).to(DEVICE)
    for layer in range(CFG.num_layers):
        y = torch.randn(24, PROJ_OUT[proj], generator=g).to(DEVICE)
        ours, ref = y.clone(), y.clone()
        assert step.add_triton(layer, proj, x, ours)
        step.add_torch(layer, proj, x, ref)
        assert (ours - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
        assert torch.equal(ours[5:7], y[5:7]) and torch.equal(ours[20:21], y[20:21])  # base rows untouched


def test_mixed_dtypes_and_strided_rows_fall_back():
    a, b, _ = adapters()
    step = LoraStep(((0, 1, a.to(DEVICE, torch.float32)), (1, 2, b.to(DEVICE, torch.bfloat16))))
    x, y = torch.randn(2, 200, device=DEVICE), torch.zeros(2, 280, device=DEVICE)
    assert not step.add_triton(0, "qkv", x, y) and torch.equal(y, torch.zeros_like(y))
    one = LoraStep(((0, 2, a.to(DEVICE, torch.float32)),))
    assert not one.add_triton(0, "qkv", x, y.t().contiguous().t())  # (columns not unit-stride)
    assert one.add_triton(CFG.num_layers + 3, "qkv", x, y)  # (past every layer: nothing to add)


def test_the_eager_forward_through_the_triton_kernel_matches_peft(tmp_path, monkeypatch):
    """The GPU path's order of calls (the eager forward) with every LoRA delta by the kernel."""
    pytest.importorskip("peft")
    from agentrt.adapters import read_peft
    from agentrt.model.generate import prompt_logits
    from tests.test_adapters import base, ids, make_adapter, oracle

    hf, model = base(tmp_path)
    pm = make_adapter(hf, tmp_path / "a", seed=7, rank_pattern={"q_proj": 2})
    adapter = read_peft(tmp_path / "a", model.cfg, "a")

    def by_triton(self, layer, proj, x, y):
        assert self.add_triton(layer, proj, x, y)
    monkeypatch.setattr(LoraStep, "add", by_triton)
    prompt = ids(19)
    ours = prompt_logits(model, prompt, adapter=adapter, path="eager")
    assert (ours - oracle(pm, prompt)).abs().max().item() <= 1e-4
