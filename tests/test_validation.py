"""Issue 13, "validate everything at the boundary": every public constructor and entry point
checks types and finite ranges and raises a typed agentrt error that says what to do. Each bug
the probes found has a regression test named after its symptom."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
from pathlib import Path

import anyio
import pytest
import torch

from agentrt.config import EngineConfig
from agentrt.engine import validate
from agentrt.engine.engine import Engine
from agentrt.errors import ActorError, ConfigError, ToolDefinitionError
from agentrt.model.generate import generate
from agentrt.model.loaders.load import load_model
from agentrt.records.params import MIN_TEMPERATURE
from agentrt.runtime.agent import Agent, GenerationSettings
from agentrt.runtime.runtime import Runtime
from agentrt.sampling import SamplingParams, adjusted_probs, sample_batch
from agentrt.tools import Tool
from tests.conftest import tiny_model
from tests.engine_util import assert_quiescent

NAN, INF = float("nan"), float("inf")


# ---- SamplingParams --------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(temperature=NAN), dict(temperature=INF), dict(temperature=-INF), dict(temperature=-0.5),
    dict(temperature="0.7"), dict(temperature=None), dict(temperature=True),
    dict(max_tokens=2.5), dict(max_tokens=2.0), dict(max_tokens="5"), dict(max_tokens=True),
    dict(max_tokens=None), dict(max_tokens=0), dict(max_tokens=NAN),
    dict(top_p=NAN), dict(top_p=0.0), dict(top_p=1.5), dict(top_p=INF), dict(top_p="1"),
    dict(top_k=1.5), dict(top_k=-1), dict(top_k=False), dict(top_k="3"),
    dict(seed=1.5), dict(seed="42"), dict(seed=True),
    dict(stop_token_ids="</s>"), dict(stop_token_ids=5), dict(stop_token_ids=[1, -1]),
    dict(stop_token_ids=[1.0]), dict(stop_token_ids={"a": 1}),
    dict(ignore_eos=1), dict(ignore_eos="yes"),
])
def test_sampling_params_rejects_bad_types_and_non_finite_values(kw):
    with pytest.raises(ConfigError) as e:
        SamplingParams(**kw)
    assert "SamplingParams." + next(iter(kw)) in str(e.value)  # the message names the field


def test_nan_temperature_raises_config_error_instead_of_killing_the_engine_step():
    with pytest.raises(ConfigError, match="temperature must be a finite number"):
        SamplingParams(temperature=NAN)
    with pytest.raises(ConfigError):
        SamplingParams().replace(temperature=NAN)  # replace() runs the same checks


def test_tiny_temperature_1e_40_is_greedy_instead_of_nan_probabilities():
    p = SamplingParams(temperature=1e-40)
    assert p.temperature == 0.0 and p.greedy
    assert SamplingParams(temperature=MIN_TEMPERATURE / 2).greedy
    assert not SamplingParams(temperature=MIN_TEMPERATURE).greedy
    # the coldest sampled temperature keeps the softmax finite for large logits
    logits = torch.tensor([[3.0e4, -2.0e4, 1.0e4, 0.0]])
    probs = adjusted_probs(logits, SamplingParams(temperature=MIN_TEMPERATURE))
    assert torch.isfinite(probs).all() and probs[0, 0] == 1.0
    gens = [torch.Generator().manual_seed(0)]
    assert sample_batch(logits, [SamplingParams(temperature=MIN_TEMPERATURE)], gens) == [0]


def test_max_tokens_2_5_raises_config_error_instead_of_slice_type_error_in_the_step():
    with pytest.raises(ConfigError, match="max_tokens must be an int"):
        SamplingParams(max_tokens=2.5)


def test_sampling_params_normalises_valid_values():
    import numpy as np

    p = SamplingParams(max_tokens=np.int64(7), temperature=1, top_k=np.int32(5), top_p=np.float64(0.5),
                       seed=np.int64(3), stop_token_ids=[2, 3])
    assert (type(p.max_tokens), type(p.temperature), type(p.top_k), type(p.top_p), type(p.seed)) == \
        (int, float, int, float, int)
    assert p.stop_token_ids == (2, 3) and hash(p) == hash(SamplingParams(7, 1.0, 5, 0.5, 3, (2, 3)))
    assert SamplingParams(stop_token_ids=range(3)).stop_token_ids == (0, 1, 2)
    assert SamplingParams(seed=-5).seed == -5


# ---- EngineConfig ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(kv_cache_tokens=4096.0), dict(page_size="16"), dict(page_size=True), dict(max_session_seqs=-1),
    dict(max_transient_seqs=0), dict(n_batch=None), dict(chunk_min=1.5), dict(spec_max_draft=-1),
    dict(response_cache_size=2.0), dict(latency_sensitive_max_tokens=-1),
    dict(acquire_timeout=NAN), dict(acquire_timeout=INF), dict(acquire_timeout=-1), dict(acquire_timeout="30"),
    dict(high_water=NAN), dict(high_water=0.0), dict(high_water=1.5), dict(cell_budget_fraction=INF),
    dict(spec_min_acceptance=NAN), dict(spec_min_acceptance=2.0),
    dict(enable_radix_cache=1), dict(enable_speculation="no"), dict(debug_invariants=None),
    dict(enable_return_prefetch=1),
    dict(bare_tool_calls=0), dict(forward_path="fast"), dict(forward_path=None), dict(tool_format=["hermes"]),
    dict(eviction_policy="fifo"), dict(eviction_policy=None),
])
def test_engine_config_rejects_bad_types_and_ranges(kw):
    with pytest.raises(ConfigError) as e:
        EngineConfig(**kw)
    assert next(iter(kw)) in str(e.value)


def test_engine_config_checks_every_field():
    """A new field must be added to the checks: each one is given a value of the wrong type."""
    wrong = {int: "x", float: "x", bool: "x", str: 5}
    for f in dataclasses.fields(EngineConfig):
        default = getattr(EngineConfig(), f.name)
        # (None defaults: a str is wrong, but a str is the very type of the state dir's path)
        bad = wrong[type(default)] if default is not None else 5 if f.name == "state_dir" else "x"
        with pytest.raises(ConfigError):
            EngineConfig(**{f.name: bad})


def test_engine_config_relations_and_valid_values():
    with pytest.raises(ConfigError, match="chunk_min"):
        EngineConfig(chunk_min=512, chunk_max=256)
    with pytest.raises(ConfigError, match="at least one page"):
        EngineConfig(kv_cache_tokens=8)
    with pytest.raises(ConfigError, match="spec_min_ngram"):
        EngineConfig(spec_min_ngram=3, spec_max_ngram=2)
    c = EngineConfig(acquire_timeout=5, high_water=1, spec_min_acceptance=0)
    assert type(c.acquire_timeout) is float and c.high_water == 1.0
    assert EngineConfig().replace(page_size=32).page_size == 32


# ---- Engine.generate / complete / open_session -----------------------------------------------
def _gen():
    yield 1


@pytest.mark.parametrize("prompt", [torch.tensor([1, 2, 3]), (t for t in [1, 2]), "hello", b"\x01",
                                    [], (), None, 5, [1, 2.0], [1, True], ["1"], {1: 2}])
def test_bad_prompt_raises_config_error_not_type_or_attribute_error(prompt):
    with pytest.raises(ConfigError):
        validate.check_generate_args(None, prompt, None)


@pytest.mark.parametrize("params", [{"max_tokens": 5}, 5, "greedy", [SamplingParams()]])
def test_dict_params_raise_config_error_not_attribute_error(params):
    with pytest.raises(ConfigError, match="SamplingParams"):
        validate.check_generate_args(None, [1, 2], params)


def test_generate_args_normalised():
    import numpy as np

    prompt, params = validate.check_generate_args(None, (np.int64(4), 5), None)
    assert prompt == [4, 5] and type(prompt[0]) is int and params == SamplingParams()
    for kw in (dict(cache_salt=5), dict(tag=["a"]), dict(timeout=NAN), dict(timeout=-1), dict(timeout="1"),
               dict(session="s1")):
        with pytest.raises(ConfigError):
            validate.check_generate_args(None, [1], None, **kw)
    with pytest.raises(ConfigError):
        validate.check_open_session_args(tag=3)
    with pytest.raises(ConfigError):
        validate.check_open_session_args(timeout=NAN)


def _engine_calls_the_checks() -> bool:
    return "check_generate_args" in inspect.getsource(Engine.generate)


def _run(fn):
    async def main():
        async with Engine(tiny_model("llama"), EngineConfig(kv_cache_tokens=4096)) as eng:
            await fn(eng)
            with anyio.fail_after(30):
                while eng.stats().running or eng.stats().waiting:
                    await anyio.sleep(0.01)
            await eng.run_in_step_thread(eng.core.check_invariants)
            await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
    anyio.run(main)


def test_tensor_or_generator_prompt_through_engine_raises_config_error_and_engine_goes_on():
    async def fn(eng):
        for prompt in (torch.tensor([1, 2, 3]), (t for t in [1, 2, 3]), [1, 2.0], [1, True]):
            with pytest.raises(ConfigError):
                await eng.complete(prompt, SamplingParams(max_tokens=2))
        out = await eng.complete([5, 6, 7], SamplingParams(max_tokens=3))
        assert out.token_ids == generate(tiny_model("llama"), [5, 6, 7], SamplingParams(max_tokens=3))
    _run(fn)


def test_dict_params_through_engine_raise_config_error():
    async def fn(eng):
        with pytest.raises(ConfigError):
            await eng.complete([1, 2, 3], {"max_tokens": 2})
        with pytest.raises(ConfigError):
            await eng.complete([1, 2, 3], SamplingParams(max_tokens=2), cache_salt=5)
    _run(fn)


def test_tiny_temperature_through_engine_samples_like_greedy_and_the_step_survives():
    async def fn(eng):
        prompt = list(range(3, 40))
        greedy = generate(tiny_model("llama"), prompt, SamplingParams(max_tokens=6))
        async with anyio.create_task_group() as tg:
            results = {}

            async def one(key, params):
                results[key] = (await eng.complete(prompt, params)).token_ids

            tg.start_soon(one, "cold", SamplingParams(max_tokens=6, temperature=1e-40))
            tg.start_soon(one, "other", SamplingParams(max_tokens=6, temperature=0.8, seed=1))
        assert results["cold"] == greedy and len(results["other"]) == 6
    _run(fn)


# ---- Agent -----------------------------------------------------------------------------------
def f1(x: int) -> int:
    """First."""
    return x


def f2(x: int) -> int:
    """Second."""
    return x


def test_agent_with_two_tools_of_the_same_name_raises_instead_of_keeping_the_last():
    dup = Tool.from_function(f2, name="f1")
    with pytest.raises(ToolDefinitionError, match="already registered"):
        Agent("a", "", [f1, dup])
    with pytest.raises(ToolDefinitionError):
        Agent("a", "", [f1, f1])


@pytest.mark.parametrize("kw", [
    dict(name=""), dict(name=None), dict(name=5), dict(instructions=None), dict(instructions=["x"]),
    dict(tools=f1), dict(tools="f1"), dict(tools=5), dict(engine="engine"),
    dict(settings={"max_tokens": 5}), dict(settings=5),
    dict(max_tool_rounds=-1), dict(max_tool_rounds=2.5), dict(max_tool_rounds="3"), dict(max_tool_rounds=True),
    dict(tool_choice="nonexistent"), dict(tool_choice=5), dict(tool_choice={"type": "function"}),
    dict(tool_choice={"type": "function", "function": {"name": "nope"}}), dict(tool_choice=""),
    dict(constrained="yes"), dict(parallel_tool_calls=None),
    dict(stop_at_tools="f1"), dict(stop_at_tools=["nope"]), dict(stop_at_tools=5),
])
def test_agent_rejects_bad_arguments(kw):
    args = dict(name="a", instructions="", tools=[f1, f2]) | kw
    name, instructions, tools = args.pop("name"), args.pop("instructions"), args.pop("tools")
    with pytest.raises(ConfigError):
        Agent(name, instructions, tools, **args)


def test_agent_accepts_valid_arguments():
    for choice in ("auto", "none", "required", "any", None, "f2",
                   {"type": "function", "function": {"name": "f1"}}):
        a = Agent("a", "be brief", [f1, f2], tool_choice=choice)
        assert a.tool_choice == choice
    a = Agent("a", "", (f for f in [f1, f2]), settings=GenerationSettings(max_tokens=9), max_tool_rounds=0,
              stop_at_tools=["f2"])
    assert list(a.tools) == ["f1", "f2"] and a.settings.max_tokens == 9 and a.stop_at_tools == ("f2",)
    assert a.fresh().tools.keys() == a.tools.keys()


# ---- Runtime.spawn ---------------------------------------------------------------------------
class Echo:
    async def handle(self, message, ctx):
        return message


def test_runtime_spawn_rejects_bad_arguments():
    async def main():
        async with Runtime() as rt:
            for kw in (dict(name=""), dict(name=5), dict(mailbox_size=0), dict(mailbox_size=2.5),
                       dict(mailbox_size="8"), dict(mailbox_size=True), dict(supervision="restart")):
                with pytest.raises(ConfigError):
                    await rt.spawn(Echo(), **kw)
            with pytest.raises(ConfigError, match="instance"):
                await rt.spawn(Echo)
            with pytest.raises(ConfigError, match="handle"):
                await rt.spawn(object())
            ref = await rt.spawn(Echo(), name="e", mailbox_size=2)
            assert await ref.ask("hi", timeout=5) == "hi"
            with pytest.raises(ActorError):
                await rt.spawn(Echo(), name="e")
    anyio.run(main)


# ---- load_model ------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [
    dict(source=5), dict(source=None), dict(source=""), dict(source=b"model.gguf"),
    dict(quantize="int4"), dict(quantize=None), dict(quantize=["none"]), dict(forward="auto"), dict(forward=1),
    dict(kernels="cuda"), dict(device="gpu0"), dict(device=0.5), dict(dtype="fp16"),
])
def test_load_model_rejects_bad_arguments_before_reading_files(kw):
    with pytest.raises(ConfigError):
        load_model(**kw)


def test_load_model_takes_a_path(tmp_path: Path):
    from agentrt.errors import ModelNotFound

    with pytest.raises(ModelNotFound):
        load_model(tmp_path / "missing.gguf")


# ---- ChatAgentrt -----------------------------------------------------------------------------
_FAKE_ENGINE = types.SimpleNamespace(chat_format=lambda: None)


@pytest.mark.parametrize("kw", [
    dict(temperature=NAN), dict(temperature=INF), dict(temperature=-1.0), dict(temperature="0.5"),
    dict(max_tokens=2.5), dict(max_tokens="5"), dict(max_tokens=True), dict(max_tokens=0),
    dict(top_p=NAN), dict(top_p=0.0), dict(top_k=-1), dict(top_k=1.5), dict(seed="1"),
    dict(constrained="yes"), dict(parallel_tool_calls=None),
])
def test_chat_agentrt_nan_temperature_and_bad_fields_raise_config_error_at_construction(kw):
    pytest.importorskip("langchain_core")
    from agentrt.integrations.langgraph.chat_model import ChatAgentrt

    with pytest.raises(ConfigError):
        ChatAgentrt(engine=_FAKE_ENGINE, **kw)


def test_chat_agentrt_rejects_a_non_engine():
    pytest.importorskip("langchain_core")
    from agentrt.integrations.langgraph.chat_model import ChatAgentrt

    with pytest.raises(ConfigError, match="Engine"):
        ChatAgentrt(engine="not an engine")


def test_chat_agentrt_call_overrides_are_validated():
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from agentrt.integrations.langgraph.chat_model import ChatAgentrt

    # the checks run before any engine work: _spec builds the call's SamplingParams
    model = ChatAgentrt.model_construct(max_tokens=8, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                                        constrained=True, parallel_tool_calls=True, model_name="m")
    for kw in (dict(temperature=NAN), dict(max_tokens=2.5), dict(top_p=INF), dict(seed="x")):
        with pytest.raises(ConfigError):
            model._spec([HumanMessage("hi")], None, kw)
    assert math.isclose(model._spec([HumanMessage("hi")], None, {"temperature": 0.5}).params.temperature, 0.5)
