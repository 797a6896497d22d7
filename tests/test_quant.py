"""int8 layers (weights per group of 32, activations per row) against the fp32 model: a logits
tolerance and greedy agreement."""

from __future__ import annotations

import copy

import pytest
import torch

from agentrt.errors import ConfigError
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.quant import quantize
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model


def test_int8_logits_close_to_fp32_on_tiny_model():
    fp32 = tiny_model("qwen2")
    q = quantize(copy.deepcopy(fp32), "int8")
    ids = list(range(7, 90))
    a, b = prompt_logits(fp32, ids), prompt_logits(q, ids)
    rel = (a - b).abs().max() / a.abs().max()
    assert rel < 0.05
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree > 0.9
    with pytest.raises(ConfigError):
        quantize(copy.deepcopy(fp32), "int3")
    # a step where no row needs logits: the head gets zero rows
    assert q.lm_head(torch.zeros(0, fp32.cfg.hidden_size)).shape == (0, fp32.cfg.vocab_size)
    # one integer GEMM for every size: a row's result does not depend on the rows beside it
    x = torch.randn(40, fp32.cfg.hidden_size)
    assert torch.allclose(q.lm_head(x)[7:8], q.lm_head(x[7:8]), rtol=1e-5, atol=1e-5)


@pytest.mark.embedded
@pytest.mark.slow
def test_int8_embedded_greedy_agreement(embedded):
    q = quantize(copy.deepcopy(embedded.model), "int8")
    ids = embedded.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    a, b = prompt_logits(embedded.model, ids), prompt_logits(q, ids)
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    assert agree >= 0.85, agree
    out_a = generate(embedded.model, ids, SamplingParams(max_tokens=16))
    out_b = generate(q, ids, SamplingParams(max_tokens=16))
    assert out_a[:3] == out_b[:3]
