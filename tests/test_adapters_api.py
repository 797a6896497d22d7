"""Choosing an adapter per agent, per LangGraph chat model and per server request (issue 58): the
answers follow the adapter's weights (another adapter or the base answers differently; the same
weights under another name answer the same), the server names adapters as models (vLLM's
convention) and lists them, and a name nobody loaded is a typed error or a 404."""

from __future__ import annotations

import anyio
import pytest

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams
from agentrt.errors import ConfigError, UnknownAdapter
from tests.conftest import make_hf_model, tiny_native_with_tokenizer
from tests.test_adapters import make_adapter

pytest.importorskip("peft")

SHAPE = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=8192)  # (tiny_native_with_tokenizer's, seed 5)
SETTINGS = SamplingParams(max_tokens=12)
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    hf = make_hf_model("llama", seed=5, **SHAPE)
    for i, name in enumerate(["a", "b"]):
        make_adapter(hf, root / name, seed=90 + i)
    return {"a": root / "a", "b": root / "b", "a-copy": root / "a"}


def test_agents_answer_with_their_adapter(dirs):
    async def main():
        async with Engine(tiny_native_with_tokenizer(), EngineConfig(kv_cache_tokens=8192)) as engine, \
                Runtime(engine) as rt:
            for name, path in dirs.items():
                await engine.load_adapter(name, path)
            out = {}
            for adapter in ("a", "b", "a-copy", None):
                ref = await rt.spawn(Agent(f"agent-{adapter}", "Answer briefly.", adapter=adapter, settings=SETTINGS))
                out[adapter] = (await ref.ask(QUESTION)).text
            bad = await rt.spawn(Agent("bad", "Answer briefly.", adapter="nobody", settings=SETTINGS))
            with pytest.raises(UnknownAdapter, match="'nobody'"):
                await bad.ask(QUESTION)
            return out
    out = anyio.run(main)
    assert out["a"] == out["a-copy"] and len({out["a"], out["b"], out[None]}) == 3
    with pytest.raises(ConfigError, match="adapter"):
        Agent("x", adapter="")


def test_chat_model_and_server_run_the_named_adapter(dirs):
    openai = pytest.importorskip("openai")
    from agentrt.integrations.langgraph import ChatAgentrt
    from agentrt.server import ServerConfig, ServerThread

    async def in_process():
        async with Engine(tiny_native_with_tokenizer(), EngineConfig(kv_cache_tokens=8192)) as engine:
            await engine.load_adapter("a", dirs["a"])
            return {a: (await ChatAgentrt(engine=engine, adapter=a, max_tokens=12).ainvoke(QUESTION)).content
                    for a in ("a", None)}
    local = anyio.run(in_process)
    assert local["a"] != local[None]
    config = ServerConfig(port=0, model_name="base", adapters=(("a", str(dirs["a"])),))
    with ServerThread(tiny_native_with_tokenizer(), config) as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused")
        assert [m.id for m in client.models.list().data] == ["base", "a"]
        ask = dict(messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=12)
        served = {m: client.chat.completions.create(model=m, **ask).choices[0].message.content for m in ("a", "base")}
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="b", **ask)
    assert served == {"a": local["a"], "base": local[None]}
