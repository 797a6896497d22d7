"""Llama 3, linear, YaRN, long-RoPE and dynamic NTK RoPE scaling, Qwen3 and Mistral against transformers.

Each architecture is a tiny random transformers model, saved with save_pretrained (safetensors)
and written as GGUF with gguf.GGUFWriter the way llama.cpp's converter lays it out (tensor names
from gguf's own name map, Q/K rows permuted for Llama-layout architectures, Llama 3 scaling as
rope_freqs.weight computed here by the converter's formula). Both are loaded through
load_model and must give transformers' logits and greedy tokens on the eager and fused paths.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from agentrt.errors import CorruptModelFile, UnsupportedModel
from agentrt.kernels import native
from agentrt.kv.store import KVStore
from agentrt.model import fused
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.loaders.hf import config_from_hf, load_hf_dir
from agentrt.model.loaders.load import load_model
from agentrt.model.quant import QLinear
from agentrt.sampling import SamplingParams

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # all three bands at D=16
# name -> (transformers class prefix, config overrides, GGUF architecture)
ARCHS = {
    "llama3": ("Llama", dict(rope_parameters=LLAMA3, tie_word_embeddings=False), "llama"),
    "llama-linear": ("Llama", dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 5e4},
                                   tie_word_embeddings=True), "llama"),
    "qwen3": ("Qwen3", dict(head_dim=32, tie_word_embeddings=True), "qwen3"),  # head_dim != 64 / 4
    "mistral": ("Mistral", dict(sliding_window=None, tie_word_embeddings=False), "mistral"),
    # Qwen2.5's long-context YaRN (factor 4 over an original context of 64: every band present at D=16)
    "qwen2-yarn": ("Qwen2", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                  "original_max_position_embeddings": 64},
                                 tie_word_embeddings=True), "qwen2"),
}
GGUF_TENSOR_MAP = {"llama": gguf.MODEL_ARCH.LLAMA, "mistral": gguf.MODEL_ARCH.LLAMA, "qwen3": gguf.MODEL_ARCH.QWEN3,
                   "qwen2": gguf.MODEL_ARCH.QWEN2}
PROMPT, NEW_TOKENS, DECODED = 120, 6, 4
needs_native = pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")


@dataclass(frozen=True)
class Built:
    hf: torch.nn.Module
    hf_dir: Path
    gguf_f32: Path
    gguf_q8: Path
    prompt: list[int]
    logits: torch.Tensor  # transformers' prompt logits [T, V]
    greedy: list[int]  # transformers' greedy continuation
    tail: torch.Tensor  # transformers' logits of the last DECODED positions of prompt + greedy


def make_hf(name: str):
    prefix, overrides, _ = ARCHS[name]
    torch.manual_seed(list(ARCHS).index(name))
    cfg = getattr(transformers, prefix + "Config")(**COMMON, **overrides)
    model = getattr(transformers, prefix + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):  # random norms, q_norm/k_norm included (init is ones)
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return sharpen(model)


def sharpen(hf):
    """Sharper attention (q/k x3: positions, RoPE and its scaling, matter more) and spread logits
    (final norm x8: no near-ties in greedy)."""
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.mul_(3.0)
        hf.model.norm.weight.mul_(8.0)
    return hf


def oracle(hf) -> tuple[list[int], torch.Tensor, list[int], torch.Tensor]:
    """transformers' answers on the test prompt: (prompt, its logits, the greedy continuation,
    the logits of the last DECODED positions of prompt + continuation)."""
    prompt = torch.randint(0, COMMON["vocab_size"], (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0]
        greedy = hf_greedy(hf, prompt, NEW_TOKENS)
        tail = hf(torch.tensor([prompt + greedy])).logits[0, -DECODED:]
    return prompt, logits, greedy, tail


def llamacpp_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """convert_hf_to_gguf's DecoderModel.permute of Q/K rows (for the interleaved RoPE)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llamacpp_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf's rope_freqs.weight for Llama 3 scaling (per-frequency divisors)."""
    freqs = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    old, lo, hi, factor = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                           rope["high_freq_factor"], rope["factor"])
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(path: Path, hf, arch: str, qtype=gguf.GGMLQuantizationType.F32, extra_kv=None) -> None:
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = c.rope_parameters
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if rope["rope_type"] == "yarn":  # as convert_hf_to_gguf writes Qwen2's
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for key, value in (extra_kv or {}).items():
        w.add_uint32(key, value)
    _add_tensors(w, hf, arch, qtype)
    if rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", llamacpp_rope_freqs(rope, head_dim))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_tensors(w: gguf.GGUFWriter, hf, arch: str, qtype) -> None:
    c = hf.config
    names = gguf.get_tensor_name_map(GGUF_TENSOR_MAP[arch], c.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if arch in ("llama", "mistral") and ".q_proj." in name:
            t = llamacpp_permute(t, c.num_attention_heads)
        elif arch in ("llama", "mistral") and ".k_proj." in name:
            t = llamacpp_permute(t, c.num_key_value_heads)
        base, suffix = name.rsplit(".", 1)
        array = t.float().numpy()
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(f"{names.get_name(base)}.{suffix}", gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(f"{names.get_name(base)}.{suffix}", array)


def hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def build(name: str, root: Path) -> Built:
    hf, arch = make_hf(name), ARCHS[name][2]
    hf.save_pretrained(root / "hf", safe_serialization=True)
    write_gguf(root / "f32.gguf", hf, arch)
    write_gguf(root / "q8.gguf", hf, arch, gguf.GGMLQuantizationType.Q8_0)
    return Built(hf, root / "hf", root / "f32.gguf", root / "q8.gguf", *oracle(hf))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> Built, each built once for the module."""
    cache: dict[str, Built] = {}

    def get(name: str) -> Built:
        if name not in cache:
            cache[name] = build(name, tmp_path_factory.mktemp(name))
        return cache[name]
    return get


@pytest.fixture(scope="module", params=list(ARCHS))
def built(request, models) -> Built:
    return models(request.param)


@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
@pytest.mark.parametrize("source", ["hf", "gguf"])
def test_matches_transformers(built, source, path):
    src = built.hf_dir if source == "hf" else built.gguf_f32
    model = load_model(str(src), quantize="none", forward=path).model
    ours = prompt_logits(model, built.prompt)
    assert (ours - built.logits).abs().max().item() < 1e-4
    assert generate(model, built.prompt, SamplingParams(max_tokens=NEW_TOKENS)) == built.greedy
    decoded = decode_logits(model, built.prompt + built.greedy, path)  # one token per step over the KV
    assert (decoded - built.tail).abs().max().item() < 1e-4


def test_both_sources_give_one_config(built):
    a = load_hf_dir(built.hf_dir).config
    b = load_model(str(built.gguf_f32), quantize="none").config
    assert a.replace(rope_freq_factors=None) == b.replace(rope_freq_factors=None)
    assert (a.rope_freq_factors is None) == (b.rope_freq_factors is None)
    if a.rope_freq_factors is not None:  # from config.json vs from rope_freqs.weight / rope.scaling.*
        np.testing.assert_allclose(a.rope_freq_factors, b.rope_freq_factors, rtol=1e-6)
    if built.hf.config.rope_parameters["rope_type"] == "llama3":  # all three bands present
        assert a.rope_freq_factors[0] == 1.0 and a.rope_freq_factors[-1] == 8.0
        assert 1.0 < a.rope_freq_factors[1] < 8.0
    assert a.head_dim == (32 if a.arch == "qwen3" else 16) and a.qk_norm == (a.arch == "qwen3")
    if built.hf.config.rope_parameters["rope_type"] == "yarn":  # extrapolated, ramped and interpolated bands
        assert a.rope_freq_factors[0] == pytest.approx(1.0) and a.rope_freq_factors[-1] == pytest.approx(4.0)
        assert a.rope_attention_factor == pytest.approx(0.1 * math.log(4.0) + 1) == b.rope_attention_factor


@pytest.mark.parametrize("rope", [
    {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 64,  # Phi-3's
     "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5], "long_factor": [1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 12.0, 16.0]},
    {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
], ids=["longrope", "dynamic"])
@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
def test_longrope_and_dynamic_ntk_match_transformers(tmp_path, rope, path):
    """Long-RoPE past its original context (transformers then takes the long factors and the
    attention factor sqrt(1 + ln 4 / ln 64)), and dynamic NTK within max_position_embeddings."""
    torch.manual_seed(7)
    hf = sharpen(transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_parameters=rope)).eval())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    prompt, want, _, _ = oracle(hf)
    model = load_model(str(tmp_path), quantize="none", forward=path).model
    assert (prompt_logits(model, prompt) - want).abs().max().item() < 1e-4
    if rope["rope_type"] == "longrope":
        assert model.cfg.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))


@pytest.mark.parametrize("partial", [1.0, 0.5], ids=["phi3", "phi4-mini-partial-rotary"])
@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
def test_phi3_matches_transformers(tmp_path, partial, path):
    """Phi-3 / Phi-4-mini: fused qkv and gate_up projections split at load, long-RoPE with its
    attention factor, and (Phi-4-mini) partial rotary, reordered into the kernels' rotate-half."""
    rotary = int(16 * partial)
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "original_max_position_embeddings": 64,
            "short_factor": [1.0 + 0.1 * i for i in range(rotary // 2)],
            "long_factor": [1.0 + 1.5 * i for i in range(rotary // 2)]}
    torch.manual_seed(11)
    cfg = transformers.Phi3Config(**COMMON, rope_parameters=dict(rope), partial_rotary_factor=partial, pad_token_id=0,
                                  tie_word_embeddings=partial < 1, sliding_window=None,
                                  original_max_position_embeddings=64)  # (else its default, 4096, wins)
    hf = sharpen(transformers.Phi3ForCausalLM(cfg).eval())
    hf.save_pretrained(tmp_path, safe_serialization=True)
    prompt, want, greedy, tail = oracle(hf)
    write_phi3_gguf(tmp_path / "f32.gguf", hf, rope, rotary)
    write_phi3_gguf(tmp_path / "q8.gguf", hf, rope, rotary, gguf.GGMLQuantizationType.Q8_0)
    for src in (tmp_path, tmp_path / "f32.gguf"):
        model = load_model(str(src), quantize="none", forward=path).model
        assert model.cfg.arch == "phi3" and model.cfg.rotary_dim == (rotary if partial < 1 else None)
        assert model.cfg.rope_attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
        assert (prompt_logits(model, prompt) - want).abs().max().item() < 1e-4, src
        assert generate(model, prompt, SamplingParams(max_tokens=NEW_TOKENS)) == greedy
        assert (decode_logits(model, prompt + greedy, path) - tail).abs().max().item() < 1e-4
    if path == "fused":  # fused Q8_0 qkv / gate_up kept quantized, split and reordered as rows
        q8 = load_model(str(tmp_path / "q8.gguf"), quantize="native").model
        assert (prompt_logits(q8, prompt) - want).abs().max().item() < 0.03 * want.abs().max().item()


def write_phi3_gguf(path: Path, hf, rope: dict, rotary: int, qtype=gguf.GGMLQuantizationType.F32) -> None:
    """As convert_hf_to_gguf's Phi3MiniModel writes it: fused attn_qkv and ffn_up (gate and up),
    rope.dimension_count = the rotary dims, long-RoPE as rope_factors_long/short tensors."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), "phi3")
    w.add_name("tiny-phi3")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(rotary)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(4) / math.log(64)))
    w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHI3, c.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        base, suffix = name.rsplit(".", 1)
        array = t.float().numpy()
        if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(f"{names.get_name(base)}.{suffix}", gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(f"{names.get_name(base)}.{suffix}", array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_mistral_as_llama_cpp_writes_it(models, tmp_path):
    """llama.cpp converts MistralForCausalLM to architecture "llama": the same model."""
    built = models("mistral")
    write_gguf(tmp_path / "llama.gguf", built.hf, "llama")
    loaded = load_model(str(tmp_path / "llama.gguf"), quantize="none", forward="eager")
    assert loaded.config.arch == "llama"
    assert (prompt_logits(loaded.model, built.prompt) - built.logits).abs().max().item() < 1e-4


@needs_native
def test_q8_0_gguf_on_the_native_quantized_path(built, monkeypatch):
    """Q8_0 matrices kept quantized: every layer runs the integer GEMM, and decode steps the
    all-layers native call (q/k norms included), which gives the per-op path's numbers exactly.
    Both stay close to transformers' fp32 logits."""
    model = load_model(str(built.gguf_q8), quantize="native").model
    assert all(isinstance(b.attn.qkv, QLinear) and isinstance(b.mlp.down, QLinear) for b in model.blocks)
    scale = built.logits.abs().max().item()
    assert (prompt_logits(model, built.prompt) - built.logits).abs().max().item() < 0.03 * scale
    full = built.prompt + built.greedy
    all_layers = decode_logits(model, full, "fused")
    assert (all_layers - built.tail).abs().max().item() < 0.03 * scale
    eager = decode_logits(model, full, "eager")  # (torch ops between the same integer GEMMs)
    assert (all_layers - eager).abs().max().item() < 0.003 * scale
    monkeypatch.setattr(fused, "native_layers", lambda model: None)  # the per-op fused path
    assert torch.equal(decode_logits(model, full, "fused"), all_layers)


def decode_logits(model, tokens: list[int], path: str) -> torch.Tensor:
    """Logits of the last DECODED tokens, fed one per forward after a prefill of the rest."""
    n, pages = len(tokens) - DECODED, list(range(-(-len(tokens) // 16)))
    kv = KVStore.allocate(model.cfg, len(pages), 16)
    fb = build_batch([SeqChunk(tokens[:n], 0, pages)], 16)
    model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path)
    rows = []
    for i in range(n, len(tokens)):
        fb = build_batch([SeqChunk([tokens[i]], i, pages)], 16)
        rows.append(model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path)[0])
    return torch.stack(rows)


@needs_native
def test_qwen3_engine_batches_on_the_fused_path(models):
    """Batched, chunked and speculative engine steps over q/k-normed heads == one sequence at a
    time on the eager reference."""
    built = models("qwen3")
    from agentrt.config import EngineConfig
    from agentrt.engine.core import EngineCore
    from tests.engine_util import drain, submit

    model = load_model(str(built.hf_dir), quantize="none").model
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16,
                                          response_cache_size=0))
    g = torch.Generator().manual_seed(3)
    work = [(torch.randint(0, 320, (n,), generator=g).tolist() * 2, SamplingParams(max_tokens=8))
            for n in (5, 23, 40)]
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp, path="eager")


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("normed", [True, False])
@pytest.mark.parametrize("d", [8, 24, 64, 128])
def test_rope_store_kernel_against_the_torch_reference(d, normed, kv_dtype):
    """agrt_rope_store: (per-head RMSNorm +) RoPE of q and k, k and v stored at their slots, in
    a float16 store rounded exactly as torch's .to(torch.float16) rounds."""
    from agentrt.kernels import reference
    from agentrt.model.rope import RopeTable

    g = torch.Generator().manual_seed(d)
    t, h, hkv, eps = 5, 3, 1, 1e-6
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g)
    qn, kn = (1 + 0.3 * torch.randn(d, generator=g) for _ in range(2))
    rope = RopeTable(d, 64, 1e4, tuple(llamacpp_rope_freqs(LLAMA3, d).tolist()))
    pos, slots = torch.tensor([3, 17, 0, 40, 63]), torch.tensor([7, 0, 11, 2, 5])
    kc, vc = (torch.zeros(3, 4, hkv, d, dtype=kv_dtype) for _ in range(2))
    q_out = torch.empty(t, h, d)
    ptr = (lambda x: x.data_ptr()) if normed else (lambda x: None)
    native.load().agrt_rope_store(qkv.data_ptr(), t, h, hkv, d, pos.data_ptr(), rope.cos.data_ptr(),
                                  rope.sin.data_ptr(), slots.data_ptr(), ptr(qn), ptr(kn), eps,
                                  kc.data_ptr(), vc.data_ptr(), q_out.data_ptr(), int(kv_dtype == torch.float16))
    q, k, v = qkv.split([h * d, hkv * d, hkv * d], -1)
    q, k = q.reshape(t, h, d), k.reshape(t, hkv, d)
    if normed:
        q, k = reference.rms_norm(q, qn, eps), reference.rms_norm(k, kn, eps)
    cos, sin = rope.cos[pos], rope.sin[pos]
    torch.testing.assert_close(q_out, reference.rope(q, cos, sin), atol=1e-5, rtol=1e-5)
    want_k = reference.rope(k, cos, sin).to(kv_dtype)
    torch.testing.assert_close(kc.view(-1, hkv, d)[slots], want_k, atol=1e-5, rtol=1e-5 if kv_dtype == torch.float32 else 1e-3)
    assert torch.equal(vc.view(-1, hkv, d)[slots], v.reshape(t, hkv, d).to(kv_dtype))


# -- what is not supported: typed errors that say what to do ------------------------------------------

def _raw(hf_dir: Path) -> dict:
    return json.loads((hf_dir / "config.json").read_text())


def test_sliding_window_config_from_each_source(models, tmp_path):
    """A window smaller than the context slides the layers each family names; one that covers
    the context is plain causal attention (tests/test_sliding_window.py runs them)."""
    built = models("mistral")
    raw = _raw(built.hf_dir)
    cfg = config_from_hf({**raw, "sliding_window": 64})
    assert (cfg.sliding_window, cfg.window_layers, cfg.window(0), cfg.window(1)) == (64, None, 64, 64)
    assert config_from_hf({**raw, "sliding_window": 256}).sliding_window == 0  # covers it all
    qwen = {**raw, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "sliding_window": 64}
    assert config_from_hf({**qwen, "use_sliding_window": False}).sliding_window == 0
    cfg = config_from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 1})
    assert (cfg.window(0), cfg.window(1)) == (0, 64)
    cfg = config_from_hf({**qwen, "use_sliding_window": True,
                          "layer_types": ["sliding_attention", "full_attention"]})
    assert (cfg.window(0), cfg.window(1)) == (64, 0)
    write_gguf(tmp_path / "swa.gguf", built.hf, "mistral", extra_kv={"mistral.attention.sliding_window": 64})
    assert load_model(str(tmp_path / "swa.gguf")).config.sliding_window == 64


def test_unsupported_rope_scaling(models, tmp_path):
    built = models("llama3")
    raw = _raw(built.hf_dir)
    for kind in ("su", "mrope"):
        with pytest.raises(UnsupportedModel, match=kind):
            config_from_hf({**raw, "rope_parameters": {"rope_type": kind, "factor": 2.0, "rope_theta": 1e4}})
    with pytest.raises(CorruptModelFile, match="long_factor"):
        config_from_hf({**raw, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                                   "original_max_position_embeddings": 64}})
    partial = config_from_hf({**raw, "rope_parameters": {**LLAMA3, "partial_rotary_factor": 0.5}})
    assert partial.rotary_dim == 8 and len(partial.rope_freq_factors) == 4  # (scaling over the rotary dims)
    llama3 = {k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}
    with pytest.raises(CorruptModelFile, match="low_freq_factor"):
        config_from_hf({**raw, "rope_parameters": llama3})
    _rewrite(built.gguf_f32, tmp_path / "short.gguf", rope_freqs=np.ones(3, np.float32))
    with pytest.raises(CorruptModelFile, match="rope_freqs"):
        load_model(str(tmp_path / "short.gguf"))
    _rewrite(built.gguf_f32, tmp_path / "longrope.gguf", kv={"llama.rope.scaling.type": "longrope"})
    with pytest.raises(UnsupportedModel, match="longrope"):
        load_model(str(tmp_path / "longrope.gguf"))


def _rewrite(src: Path, dst: Path, rope_freqs: np.ndarray | None = None, kv: dict | None = None) -> None:
    """Copy a GGUF with its rope_freqs tensor replaced and string metadata added."""
    from agentrt.model.loaders.gguf_reader import GGUFFile

    f = GGUFFile(src)
    w = gguf.GGUFWriter(str(dst), f.fields["general.architecture"])
    for key, value in (kv or {}).items():
        w.add_string(key, value)
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv"):
        w.add_uint32(f"llama.{key}", f.fields[f"llama.{key}"])
    for t in f.tensors:
        data = rope_freqs if t.name == "rope_freqs.weight" and rope_freqs is not None else np.array(t.data)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
