"""Gemma 2 and Gemma 3 (text) against transformers, from safetensors and from GGUF.

Tiny random models with a sliding window (24) far under the 120-token prompt: Gemma 2's
alternating local/global layers with attention and final-logit softcapping, Gemma 3's five local
layers per global one with q/k head norms, a local RoPE base of 10,000 and a linearly scaled
global one. The GGUF is written as llama.cpp's converter writes it (norm weights + 1, its norm
names, NeoX RoPE order). Eager and fused paths: transformers' logits and greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from agentrt.kernels import native
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.loaders.load import load_model
from agentrt.sampling import SamplingParams
from tests.test_architectures import COMMON, NEW_TOKENS, decode_logits, oracle, sharpen

transformers = pytest.importorskip("transformers")
needs_native = pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
WINDOW = 24
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}}
CASES = {
    "gemma2": ("Gemma2", dict(num_hidden_layers=3, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3": ("Gemma3Text", dict(num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
                                  rope_parameters=GEMMA3_ROPE)),
}
_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
          "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
_LINEAR = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
           "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
           "mlp.down_proj": "ffn_down"}


def make(name: str):
    prefix, overrides = CASES[name]
    torch.manual_seed(51 + list(CASES).index(name))
    cfg = getattr(transformers, prefix + "Config")(**{**COMMON, **overrides, "pad_token_id": 0, "bos_token_id": 1,
                                                     "eos_token_id": 2})
    hf = getattr(transformers, ("Gemma3" if name == "gemma3" else prefix) + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith("norm.weight"):  # Gemma's norms are (1 + w), w initialised to 0
                p.copy_(0.3 * torch.randn_like(p))
            if pname.endswith("embed_tokens.weight"):  # (scaled by sqrt(hidden) = 8 on the way in)
                p.mul_(0.125)
    return sharpen(hf)


def write_gemma_gguf(path: Path, hf, arch: str, qtype=None, blocks: dict | None = None) -> None:
    """`qtype` (Q8_0): the attention and MLP matrices quantized by gguf; `blocks`: their raw
    K-quant blocks by GGUF name, (data, qtype)."""
    c = hf.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    w.add_tensor("output_norm.weight", (sd["model.norm.weight"] + 1).numpy())  # (the converter's + 1)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf_name, g in _NORMS.items():
            if p + hf_name + ".weight" in sd:
                w.add_tensor(f"blk.{i}.{g}.weight", (sd[p + hf_name + ".weight"] + 1).numpy())
        for hf_name, g in _LINEAR.items():
            name, t = f"blk.{i}.{g}.weight", sd[p + hf_name + ".weight"].numpy()
            if blocks is not None:
                w.add_tensor(name, blocks[name][0], raw_dtype=blocks[name][1])
            elif qtype is not None:
                w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
            else:
                w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    hf = make(name)
    hf.save_pretrained(root / "hf", safe_serialization=True)
    write_gemma_gguf(root / "f32.gguf", hf, name)
    write_gemma_gguf(root / "q8.gguf", hf, name, gguf.GGMLQuantizationType.Q8_0)
    return name, hf, root, oracle(hf)


@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
@pytest.mark.parametrize("source", ["hf", "f32.gguf"])
def test_gemma_matches_transformers(case, source, path):
    name, hf, root, (prompt, want, greedy, tail) = case
    model = load_model(str(root / source), quantize="none", forward=path).model
    cfg = model.cfg
    assert cfg.arch == name and cfg.sandwich_norms and cfg.mlp_act == "gelu_tanh"
    windows = [b.attn.window for b in model.blocks]
    assert windows == ([WINDOW, 0, WINDOW] if name == "gemma2" else [WINDOW] * 5 + [0])
    assert (cfg.attn_softcap, cfg.final_softcap) == ((50.0, 30.0) if name == "gemma2" else (0.0, 0.0))
    assert [b.attn.local_rope for b in model.blocks] == ([False] * 3 if name == "gemma2" else [True] * 5 + [False])
    assert (prompt_logits(model, prompt) - want).abs().max().item() < 1e-4
    assert generate(model, prompt, SamplingParams(max_tokens=NEW_TOKENS)) == greedy
    assert (decode_logits(model, prompt + greedy, path) - tail).abs().max().item() < 1e-4


@needs_native
def test_gemma_int8_on_the_kernels_stays_close(case):
    """Every matrix int8 (the quantized kernels, softcapped and windowed attention in C):
    within the activation-rounding bound of transformers, greedy mostly the same."""
    name, hf, root, (prompt, want, _, _) = case
    model = load_model(str(root / "hf"), quantize="int8").model
    ours = prompt_logits(model, prompt)
    assert (ours - want).abs().max().item() < 0.05 * want.abs().max().item()
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


@needs_native
def test_gemma_q8_0_gguf_on_the_native_path(case, monkeypatch):
    """A Q8_0 GGUF kept quantized: close to transformers, and the all-layers call gives the
    per-op path's numbers exactly."""
    from agentrt.model import fused

    name, hf, root, (prompt, want, greedy, tail) = case
    model = load_model(str(root / "q8.gguf"), quantize="native").model
    assert model.blocks[0].attn.qkv.parts[0].bits == 8 and fused.native_layers(model) is not None
    scale, ours = want.abs().max().item(), prompt_logits(model, prompt)  # (int8 weights and activations)
    assert (ours - want).abs().max().item() < 0.05 * scale
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9
    all_layers = decode_logits(model, prompt + greedy, "fused")
    assert (all_layers - tail).abs().max().item() < 0.05 * scale
    monkeypatch.setattr(fused, "native_layers", lambda model: None)
    assert torch.equal(decode_logits(model, prompt + greedy, "fused"), all_layers)


@needs_native
def test_gemma3_k_quant_gguf_matches_transformers(tmp_path):
    """Every attention and MLP matrix Q4_K (random blocks: gguf has no K quantizer), kept Q4_K on
    the kernels, against transformers running the same dequantized values."""
    from tests.test_moe import random_k_blocks

    prefix, overrides = CASES["gemma3"]
    torch.manual_seed(77)
    cfg = getattr(transformers, prefix + "Config")(**{**COMMON, **overrides, "hidden_size": 256,
                                                     "intermediate_size": 256, "head_dim": 64, "query_pre_attn_scalar": 64,
                                                     "pad_token_id": 0})
    hf = sharpen(transformers.Gemma3ForCausalLM(cfg).eval())
    rng, blocks, q4k = np.random.default_rng(3), {}, gguf.GGMLQuantizationType.Q4_K
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            for hf_name, g in _LINEAR.items():
                mod = layer.get_submodule(hf_name)
                rows, cols = mod.weight.shape
                data = random_k_blocks(q4k, rows, cols, rng)
                blocks[f"blk.{i}.{g}.weight"] = (data, q4k)
                mod.weight.copy_(torch.from_numpy(gguf.quants.dequantize(data, q4k).reshape(rows, cols).copy()))
    write_gemma_gguf(tmp_path / "q4k.gguf", hf, "gemma3", blocks=blocks)
    prompt, want, _, _ = oracle(hf)
    model = load_model(str(tmp_path / "q4k.gguf"), quantize="native").model
    assert model.blocks[2].mlp.down.parts[0].bits == 4 and model.blocks[2].mlp.down.parts[0].half == 2
    ours = prompt_logits(model, prompt)
    assert (ours - want).abs().max().item() < 0.05 * want.abs().max().item()
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9
    exact = load_model(str(tmp_path / "q4k.gguf"), quantize="none").model  # dequantized: fp32 exact
    assert (prompt_logits(exact, prompt) - want).abs().max().item() < 3e-5 * want.abs().max().item()


def test_softcapped_attention_reference_matches_the_kernel():
    """The torch reference and the C kernel agree on softcapped, windowed attention."""
    if not native.available():
        pytest.skip("compiled CPU kernels not built")
    from agentrt.kernels import reference
    from agentrt.model.batch import SeqChunk, build_batch

    g = torch.Generator().manual_seed(4)
    h, hkv, d, page, n = 4, 2, 64, 8, 40
    kc, vc = torch.randn(6, page, hkv, d, generator=g) * 3, torch.randn(6, page, hkv, d, generator=g)
    q = torch.randn(n, h, d, generator=g) * 3
    meta = build_batch([SeqChunk([0] * n, 0, list(range(5)))], page).meta
    want = reference.paged_attention(q, kc, vc, meta, d ** -0.5, 9, 5.0)
    out = torch.empty(n, h, d)
    table, cu = meta.page_table.contiguous(), torch.tensor(meta.cu_q, dtype=torch.int64)
    lens, seqs = meta.kv_lens_t.to(torch.int64).contiguous(), torch.tensor([0], dtype=torch.int64)
    native.load().agrt_attention(q.data_ptr(), kc.data_ptr(), vc.data_ptr(), table.data_ptr(), table.shape[1],
                                 cu.data_ptr(), lens.data_ptr(), seqs.data_ptr(), 1, h, hkv, d, page, d ** -0.5,
                                 out.data_ptr(), 0, 9, 5.0)
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    plain = reference.paged_attention(q, kc, vc, meta, d ** -0.5, 9)
    assert (plain - want).abs().max().item() > 1e-2  # (the cap bites at these scores)
    assert np.isfinite(out.numpy()).all()


@needs_native
def test_all_layers_call_equals_layer_by_layer(case, monkeypatch):
    """Quantized Gemma decode steps run every layer in one native call (post-norms, GeGLU,
    softcap, local RoPE tables in C): the same numbers as the layer-by-layer fused path."""
    from agentrt.model import fused

    name, hf, root, (prompt, _, greedy, _) = case
    model = load_model(str(root / "hf"), quantize="int8").model
    assert fused.native_layers(model) is not None
    one_call = decode_logits(model, prompt + greedy, "fused")
    monkeypatch.setattr(fused, "native_layers", lambda m: None)
    assert torch.equal(decode_logits(model, prompt + greedy, "fused"), one_call)


@needs_native
def test_gelu_mul_kernel_against_torch():
    g = torch.Generator().manual_seed(2)
    gu = torch.randn(7, 2 * 300, generator=g) * 3
    out = torch.empty(7, 300)
    native.load().agrt_gelu_mul(gu.data_ptr(), 7, 300, out.data_ptr())
    gate, up = gu.split(300, -1)
    torch.testing.assert_close(out, torch.nn.functional.gelu(gate, approximate="tanh") * up, atol=1e-5, rtol=1e-5)


def test_window_pattern_from_gguf_metadata():
    """`{arch}.attention.sliding_window_pattern` where a file has it (every n-th layer global,
    or one flag per layer), else the family's pattern."""
    from agentrt.model.loaders.gemma import sliding_layers

    assert sliding_layers("gemma3", 7) == (True,) * 5 + (False, True)
    assert sliding_layers("gemma2", 4) == (True, False, True, False)
    assert sliding_layers("gemma3", 4, pattern=2) == (True, False, True, False)
    assert sliding_layers("gemma3", 3, pattern=[True, False, False]) == (True, False, False)
    assert sliding_layers("gemma2", 2, layer_types=["full_attention", "sliding_attention"]) == (False, True)
