"""The one interface the engine calls on a constraint (agentrt/records/constraint.py): its
defaults, the grammar implementing it, and a constraint without it refused at submission."""

from __future__ import annotations

import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.constrain.grammar import ToolCallConstraint
from agentrt.engine.core import EngineCore
from agentrt.engine.engine import Engine
from agentrt.errors import ConfigError
from agentrt.model.generate import generate
from agentrt.records.constraint import LogitsConstraint
from agentrt.sampling import SamplingParams
from tests.conftest import tiny_model
from tests.engine_util import drain, submit


class AllowAll(LogitsConstraint):
    pass


class ThreeMethods:
    """The interface before it held every method the engine calls."""

    def mask_logits(self, logits):
        return logits

    def advance(self, token):
        pass

    def is_terminated(self):
        return False


def test_the_defaults_allow_everything_and_force_nothing():
    c, row = AllowAll(), torch.randn(8)
    assert c.mask_logits(row) is row and not c.is_terminated()
    c.advance(3)
    c.prepare()
    assert c.accepts_prefix([1, 2, 3]) == 0 and c.fast_forward(None, 5) == (0, [])
    assert issubclass(ToolCallConstraint, LogitsConstraint)


def test_a_default_constraint_decodes_as_unconstrained_greedy():
    model = tiny_model("llama")
    core = EngineCore(model, EngineConfig(debug_invariants=True, response_cache_size=0))
    params = SamplingParams(max_tokens=8)
    r = submit(core, [1, 2, 3, 4], params, constraint=AllowAll())
    drain(core)
    assert r.output == generate(model, [1, 2, 3, 4], params)


@pytest.mark.anyio
async def test_a_constraint_without_the_interface_is_a_config_error_before_any_work():
    """Checked once, at the public entry (engine/validate.py::check_generate_args): before a
    sequence slot is taken or anything reaches the step thread."""
    async with Engine(tiny_model("llama"), EngineConfig(debug_invariants=True)) as eng:
        with pytest.raises(ConfigError, match="LogitsConstraint"):
            await eng.complete([1, 2, 3], SamplingParams(max_tokens=4), constraint=ThreeMethods())
        assert not eng.core.has_work()
        assert eng.core.pool.num_free("transient") == eng.config.max_transient_seqs
        done = await eng.complete([1, 2, 3], SamplingParams(max_tokens=4), constraint=AllowAll())
        assert len(done.token_ids) == 4
