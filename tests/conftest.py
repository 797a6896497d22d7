"""Shared fixtures: tiny random Llama/Qwen2 models (built here, fast) and the embedded SmolLM2."""

from __future__ import annotations

import functools
import os

import pytest
import torch

# triton's kernels run in its interpreter where there is no CUDA device: set before any
# @triton.jit decoration (the kernel tests import theirs at collection), on a GPU never
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from agentrt.model.config import ModelConfig
from agentrt.model.decoder import DecoderModel

TINY = dict(vocab_size=301, hidden_size=96, intermediate_size=200, num_hidden_layers=3,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=2048,
            rope_theta=10000.0)


def make_hf_model(arch: str, seed: int = 0, **overrides):
    """A random-weight transformers model with odd sizes and GQA (6 heads over 2 kv heads)."""
    import transformers

    torch.manual_seed(seed)
    kw = {**TINY, **overrides}
    if arch == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, **kw)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(tie_word_embeddings=False, **kw)
        model = transformers.Qwen2ForCausalLM(cfg)
    # spread the logits so greedy choices are not near-ties in a random model
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def config_of(hf_model) -> ModelConfig:
    c = hf_model.config
    return ModelConfig(
        arch=c.model_type, vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
        head_dim=c.hidden_size // c.num_attention_heads, rope_theta=10000.0,
        rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.model_type == "qwen2")


@pytest.fixture(scope="session")
def anyio_backend():
    """Async tests run on asyncio (anyio's plugin would add trio; the engine's trio support is
    tested explicitly, and simulations run through agentrt.sim.run)."""
    return "asyncio"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server the test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.lru_cache(maxsize=4)
def tiny_model(arch: str = "llama", seed: int = 0) -> DecoderModel:
    hf = make_hf_model(arch, seed)
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    return m.eval()


@functools.lru_cache(maxsize=2)
def tiny_native(arch: str = "llama") -> DecoderModel:
    """A tiny random model on the default CPU path: int8 weights, a float16 KV store, the fused
    kernels (head_dim 64: the vector attention; GQA 3 heads over 1)."""
    from agentrt.model.quant import quantize

    hf = make_hf_model(arch, seed=7, hidden_size=192, intermediate_size=320, num_hidden_layers=2,
                       num_attention_heads=3, num_key_value_heads=1)
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    m = quantize(m.eval(), "int8")
    m.kv_dtype = torch.float16
    return m


@pytest.fixture(scope="session")
def tiny_llama() -> DecoderModel:
    return tiny_model("llama")


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M (fp32: the accuracy reference) with its tokenizer."""
    from agentrt.model.loaders.load import load_model

    return load_model("smollm2-135m", quantize="none")


@pytest.fixture(scope="session")
def embedded_native():
    """The embedded SmolLM2-135M with its GGUF quantization kept (Q4_1 layers, Q8_0 table)."""
    from agentrt.model.loaders.load import load_model

    return load_model("smollm2-135m", quantize="native")


@pytest.fixture(scope="session")
def embedded_native_int8():
    """embedded_native over an int8 KV store (load_model(kv_dtype="int8"))."""
    from agentrt.model.loaders.load import load_model

    return load_model("smollm2-135m", quantize="native", kv_dtype="int8")


@functools.lru_cache(maxsize=2)
def small_vocab_model(vocab: int = 8, seed: int = 4) -> DecoderModel:
    """A random model over a tiny vocabulary with a spread-out next-token distribution, for
    statistical tests that enumerate every continuation."""
    import transformers

    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False)).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(30.0)  # random init is near-uniform; make it informative
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    return m.eval()


@functools.lru_cache(maxsize=1)
def smol_tokenizer():
    """The embedded model's tokenizer alone (metadata only, no weights)."""
    from agentrt.model.loaders.files import resolve_source
    from agentrt.model.loaders.gguf import load_gguf_tokenizer

    return load_gguf_tokenizer(resolve_source("smollm2-135m"))


@functools.lru_cache(maxsize=1)
def tiny_model_with_tokenizer():
    """A tiny random model over SmolLM2's vocabulary with its real tokenizer: fast, and the
    grammar and chat format work on it."""
    from agentrt.model.loaders.load import LoadedModel

    tok = smol_tokenizer()
    hf = make_hf_model("llama", seed=3, vocab_size=49152, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=8192)
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    return LoadedModel(m.eval(), tok, m.cfg, "tiny-random")


@functools.lru_cache(maxsize=1)
def tiny_native_with_tokenizer():
    """tiny_model_with_tokenizer on the default CPU path (int8 weights, float16 KV, the fused
    kernels): batch-invariant, so two processes (Ray replicas) give the same tokens whatever their
    batches and thread counts. (Seed 5: its required tool calls close within 40 tokens; under
    some seeds the random model fills the call's arguments with whitespace until max_tokens.)"""
    from agentrt.model.loaders.load import LoadedModel
    from agentrt.model.quant import quantize

    hf = make_hf_model("llama", seed=5, vocab_size=49152, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=8192)
    m = DecoderModel(config_of(hf))
    m.load_hf_weights(hf.state_dict())
    m = quantize(m.eval(), "int8")
    m.kv_dtype = torch.float16
    return LoadedModel(m, smol_tokenizer(), m.cfg, "tiny-random-int8")


@pytest.fixture
def spans():
    """Tracing on into a fresh provider and in-memory exporter: (exporter, provider); off after
    the test (the `otel` extra; tests/tracing_util.py)."""
    pytest.importorskip("opentelemetry.sdk")
    from tests.tracing_util import traced

    with traced() as exporter_and_provider:
        yield exporter_and_provider


def pytest_terminal_summary(terminalreporter):
    """`model_quality: <passed>/<ran> passed` after a run that ran tests of that group (whether the
    embedded 135M model answered well; `make test` runs the group apart and never fails on it)."""
    ran = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) and "model_quality" in getattr(r, "keywords", {}) and r.outcome != "skipped":
                ran[r.nodeid] = ran.get(r.nodeid, True) and r.passed and not hasattr(r, "wasxfail")
    if ran:
        terminalreporter.write_line(f"model_quality: {sum(ran.values())}/{len(ran)} passed")


@pytest.fixture(scope="session")
def postgres_url():
    """A real PostgreSQL server for this test session (tests/pg_server.py: Debian's postgresql,
    a throwaway cluster); skipped, with why, where none can run."""
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install -e .[postgres])")
    from tests.pg_server import PostgresServer

    with PostgresServer() as pg:
        if pg.url is None:
            pytest.skip(pg.why)
        yield pg.url


def fresh_postgres_db(url: str) -> str:
    """A new empty database (t_<hex>) on the server of `url` (the postgres_url fixture's), its URL:
    tests do not see each other's tables."""
    from tests.pg_server import create_database

    return create_database(url)
