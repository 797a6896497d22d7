"""Repetition penalties (sampling/penalties.py) against the rules written out by hand, their
parameters' checks, and the engine's output with them equal to the one-sequence oracle, whether
the step's tail runs on the host or on the device (the CPU here)."""

from __future__ import annotations

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.engine.executor import ModelExecutor
from agentrt.errors import ConfigError
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams
from agentrt.sampling.penalties import penalize
from tests.conftest import tiny_model
from tests.engine_util import drain, submit


def test_penalties_follow_openai_and_ctrl_rules():
    row = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0])
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0)
    got = penalize(row.clone()[None], p, output=[3, 3, 1], prompt=[0, 1])
    # repetition over prompt + output {0, 1, 3}: positive / 2, negative * 2; then presence and
    # frequency over the output: token 3 (twice) -0.5 - 0.5, token 1 (once) -0.5 - 0.25
    want = torch.tensor([1.0, -2.0 - 0.75, 0.5, 1.5 - 1.0, -2.0, 1.0])
    assert torch.equal(got[0], want)
    plain = torch.tensor([1.0, 2.0])
    assert penalize(plain, SamplingParams(), [0, 1]) is plain and torch.equal(plain, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                         ("repetition_penalty", 0.0), ("min_p", 1.5)])
def test_out_of_range_penalties_are_config_errors(field, value):
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("device_tail", [False, True])
def test_penalized_engine_output_equals_the_oracle(device_tail):
    if device_tail:
        pytest.importorskip("triton")
    model = tiny_model("llama")
    prompts = [list(range(10, 40)), [5, 6, 7] * 9, list(range(200, 260, 3))]
    params = [SamplingParams(max_tokens=20, repetition_penalty=1.3),
              SamplingParams(max_tokens=20, presence_penalty=2.0, frequency_penalty=2.0),
              SamplingParams(max_tokens=20)]
    core = EngineCore(model, EngineConfig(kv_cache_tokens=8192, response_cache_size=0, enable_speculation=True),
                      executor=ModelExecutor(model, device_tail=device_tail))
    reqs = [submit(core, p, sp) for p, sp in zip(prompts, params)]
    drain(core)
    want = [generate(model, p, sp) for p, sp in zip(prompts, params)]
    assert [r.output for r in reqs] == want
    # and the penalties changed what greedy decoding writes (the tiny model repeats itself)
    assert want[1] != generate(model, prompts[1], SamplingParams(max_tokens=20))
