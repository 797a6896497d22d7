"""Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral, OLMoE) against transformers, and the grouped
native expert GEMM against a per-token reference.

Each family is a tiny random transformers model (4 experts, top 2), saved with save_pretrained
and written as GGUF the way llama.cpp's converter lays it out: the router as `ffn_gate_inp`, each
of gate/up/down as one [experts, out, in] tensor (`ffn_*_exps`), Mixtral as architecture "llama"
with Q/K rows permuted. Loaded through load_model, they must give transformers' logits and greedy
tokens on the eager and fused paths, and within the activation-rounding bound when the experts
stay quantized (Q8_0, and Q4_K from random blocks whose exact values transformers then runs).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from agentrt.kernels import native
from agentrt.kernels.packing import QuantMatrix
from agentrt.model.generate import generate, prompt_logits
from agentrt.model.loaders.gguf_quant import BLOCK, unpack_gguf
from agentrt.model.loaders.load import load_model
from agentrt.model.moe import MoE
from agentrt.model.quant import QLinear
from agentrt.sampling import SamplingParams
from tests.test_architectures import COMMON, NEW_TOKENS, decode_logits, llamacpp_permute, oracle, sharpen

transformers = pytest.importorskip("transformers")
T = gguf.GGMLQuantizationType
needs_native = pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# name -> (transformers class prefix, config overrides, GGUF architecture)
FAMILIES = {
    "qwen3_moe": ("Qwen3Moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, head_dim=32,
                                   norm_topk_prob=True, tie_word_embeddings=True), "qwen3moe"),
    "qwen2_moe": ("Qwen2Moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                   shared_expert_intermediate_size=96, norm_topk_prob=False,
                                   tie_word_embeddings=False), "qwen2moe"),
    "mixtral": ("Mixtral", dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                                tie_word_embeddings=False), "llama"),
    "olmoe": ("Olmoe", dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, tie_word_embeddings=False),
              "olmoe"),
}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
          "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp",
          "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
          "mlp.shared_expert.down_proj": "ffn_down_shexp"}


def make_hf(name: str, **overrides):
    prefix, family, _ = FAMILIES[name]
    torch.manual_seed(list(FAMILIES).index(name) + 20)
    cfg = getattr(transformers, prefix + "Config")(**{**COMMON, **IDS, **family, **overrides})
    hf = getattr(transformers, prefix + "ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            if pname.endswith("mlp.gate.weight"):  # spread router logits: no near-tied experts
                p.mul_(40.0)
    return sharpen(hf)


def experts_of(hf, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' stacked expert weights of a layer: gate_up [E, 2I, H], down [E, H, I]."""
    e = hf.model.layers[layer].mlp.experts
    return e.gate_up_proj, e.down_proj


def write_moe_gguf(path: Path, hf, arch: str, experts_q: dict | None = None, qtype=T.F32) -> None:
    """As llama.cpp's converter lays it out. `experts_q`: (layer, "gate"/"up"/"down") -> (raw
    blocks, type) written instead of the float expert tensors; `qtype`: the other matrices."""
    c = hf.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    n_experts = getattr(c, "num_local_experts", None) or c.num_experts
    w.add_expert_count(n_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if arch in ("qwen3moe", "qwen2moe"):
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    for name, array in _gguf_tensors(hf, arch, experts_q or {}):
        if isinstance(array, tuple):
            w.add_tensor(name, array[0], raw_dtype=array[1])
        elif array.ndim >= 2 and qtype != T.F32 and not name.endswith("ffn_gate_inp.weight"):
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _gguf_tensors(hf, arch: str, experts_q: dict):
    c = hf.config
    sd = {k: v.detach().float() for k, v in hf.state_dict().items()}
    yield "token_embd.weight", sd["model.embed_tokens.weight"].numpy()
    yield "output_norm.weight", sd["model.norm.weight"].numpy()
    if not c.tie_word_embeddings:
        yield "output.weight", sd["lm_head.weight"].numpy()
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for hf_name, g_name in _LAYER.items():
            if p + hf_name + ".weight" not in sd:
                continue
            t = sd[p + hf_name + ".weight"]
            if arch == "llama" and hf_name in ("self_attn.q_proj", "self_attn.k_proj"):
                t = llamacpp_permute(t, c.num_attention_heads if "q_" in hf_name else c.num_key_value_heads)
            yield f"blk.{i}.{g_name}.weight", t.numpy()
            if p + hf_name + ".bias" in sd:  # (Qwen2-MoE's q/k/v biases)
                yield f"blk.{i}.{g_name}.bias", sd[p + hf_name + ".bias"].numpy()
        if p + "mlp.shared_expert_gate.weight" in sd:  # (a [hidden] vector in llama.cpp's files)
            yield f"blk.{i}.ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"].reshape(-1).numpy()
        gate_up, down = (t.detach().float() for t in experts_of(hf, i))
        inter = gate_up.shape[1] // 2
        for part, t in (("gate", gate_up[:, :inter]), ("up", gate_up[:, inter:]), ("down", down)):
            yield f"blk.{i}.ffn_{part}_exps.weight", experts_q.get((i, part), t.contiguous().numpy())


def random_k_blocks(qtype, rows: int, cols: int, rng) -> np.ndarray:
    """Random Q4_K/Q5_K blocks with small fp16 super-block scales, the mins' scale set so that
    weights centre on 0 on average (as real weights do; all-positive ones make every expert's
    output one large shared direction)."""
    size, nbytes = BLOCK[qtype]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    d = rng.uniform(1e-4, 5e-4, blocks.shape[0]).astype(np.float32)
    levels = 7.5 if qtype == T.Q4_K else 15.5  # the mean quant level
    blocks[:, 0:4] = np.stack([d, levels * d], 1).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def quantize_experts_k(hf, qtype=T.Q4_K, seed=0) -> dict:
    """Random `qtype` blocks for every expert tensor, copied (dequantized) into `hf`: the GGUF's
    experts and transformers' then hold the same numbers."""
    rng, out = np.random.default_rng(seed), {}
    for i in range(hf.config.num_hidden_layers):
        gate_up, down = experts_of(hf, i)
        e, two_i, h = gate_up.shape
        parts = {"gate": (e, two_i // 2, h), "up": (e, two_i // 2, h), "down": tuple(down.shape)}
        values = {}
        for part, (n, rows, cols) in parts.items():
            blocks = random_k_blocks(qtype, n * rows, cols, rng)
            out[(i, part)] = (blocks.reshape(n, rows, -1), qtype)
            values[part] = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).reshape(n, rows, cols).copy())
        with torch.no_grad():
            gate_up.copy_(torch.cat([values["gate"], values["up"]], 1))
            down.copy_(values["down"])
    return out


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    hf = make_hf(name)
    hf.save_pretrained(root / "hf", safe_serialization=True)
    write_moe_gguf(root / "f32.gguf", hf, FAMILIES[name][2])
    write_moe_gguf(root / "q8.gguf", hf, FAMILIES[name][2], qtype=T.Q8_0)
    return name, hf, root, oracle(hf)


@pytest.mark.parametrize("path", ["eager", pytest.param("fused", marks=needs_native)])
@pytest.mark.parametrize("source", ["hf", "f32.gguf"])
def test_moe_matches_transformers(family, source, path):
    name, hf, root, (prompt, want, greedy, tail) = family
    model = load_model(str(root / source), quantize="none", forward=path).model
    cfg = model.cfg
    assert (cfg.arch, cfg.num_experts, cfg.experts_per_token) == (name, 4, 2)
    assert cfg.norm_topk_prob == (name not in ("olmoe", "qwen2_moe")) and isinstance(model.blocks[0].mlp, MoE)
    assert (model.blocks[0].mlp.shared is not None) == (name == "qwen2_moe")
    assert (prompt_logits(model, prompt) - want).abs().max().item() < 1e-4
    assert generate(model, prompt, SamplingParams(max_tokens=NEW_TOKENS)) == greedy
    assert (decode_logits(model, prompt + greedy, path) - tail).abs().max().item() < 1e-4


@needs_native
def test_q8_experts_stay_quantized_and_match_transformers(family):
    """Q8_0 experts run as Q8_0 through the grouped kernel, all layers in one native call
    (OLMoE's whole-projection q/k norms: layer by layer)."""
    name, hf, root, (prompt, want, greedy, _) = family
    model = load_model(str(root / "q8.gguf"), quantize="native").model
    expert = model.blocks[0].mlp.experts[0]
    assert isinstance(expert.gate_up, QLinear) and expert.gate_up.parts[0].bits == 8
    from agentrt.model import fused

    assert (fused.native_layers(model) is None) == (name in ("olmoe", "qwen2_moe"))
    ours = prompt_logits(model, prompt)
    # the same Q8_0 weights dequantized, in fp32 (the weights' own rounding is not the kernel's)
    exact = prompt_logits(load_model(str(root / "q8.gguf"), quantize="none").model, prompt)
    assert (ours - exact).abs().max().item() < 0.03 * exact.abs().max().item()
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9


@needs_native
@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_k_quant_experts_match_transformers(tmp_path, name):
    """Q4_K experts (random blocks: gguf has no K quantizer) kept as Q4_K, against transformers
    running the same dequantized values."""
    hf = make_hf(name, hidden_size=256, intermediate_size=256, moe_intermediate_size=256, head_dim=64)
    blocks = quantize_experts_k(hf)
    write_moe_gguf(tmp_path / "q4k.gguf", hf, FAMILIES[name][2], experts_q=blocks)
    prompt, want, _, _ = oracle(hf)
    model = load_model(str(tmp_path / "q4k.gguf"), quantize="native").model
    assert model.blocks[1].mlp.experts[3].down.parts[0].bits == 4
    ours = prompt_logits(model, prompt)
    # int8 activations can flip a token's expert where two are close: most rows, not every row
    row_err = (ours - want).abs().max(-1).values
    assert row_err.median().item() < 0.03 * want.abs().max().item()
    assert (ours.argmax(-1) == want.argmax(-1)).float().mean().item() > 0.9
    exact = load_model(str(tmp_path / "q4k.gguf"), quantize="none").model  # dequantized: fp32 exact
    assert (prompt_logits(exact, prompt) - want).abs().max().item() < 3e-5 * want.abs().max().item()


FORMATS = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K, "int8")


def _expert_matrix(fmt, rows: int, cols: int, rng) -> QuantMatrix:
    if fmt == "int8":
        from agentrt.kernels.packing import quantize_int8

        return quantize_int8(torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1))
    if fmt in (T.Q4_K, T.Q5_K, T.Q6_K):
        blocks = random_k_blocks(fmt, rows, cols, rng) if fmt != T.Q6_K else _q6k(rows, cols, rng)
    else:
        blocks = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, fmt)
    return unpack_gguf(blocks, fmt, rows, cols)


def _q6k(rows: int, cols: int, rng) -> np.ndarray:
    size, nbytes = BLOCK[T.Q6_K]
    blocks = rng.integers(0, 256, (rows * cols // size, nbytes), dtype=np.uint8)
    blocks[:, 208:210] = rng.uniform(2e-4, 1e-3, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


@needs_native
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: getattr(f, "name", f))
def test_grouped_expert_gemm_against_per_token_reference(fmt):
    """agrt_moe over a batch == each token alone through its own experts (QLinear, one row at a
    time, added in ascending expert order), for every format the experts can be in."""
    from agentrt.model import fused
    from agentrt.model.config import ModelConfig
    from agentrt.model.quant import linear_from

    rng, hidden, inter, n_exp = np.random.default_rng(3), 256, 512, 6
    cfg = ModelConfig(arch="qwen3_moe", vocab_size=8, hidden_size=hidden, intermediate_size=0, num_layers=1,
                      num_heads=4, num_kv_heads=4, head_dim=64, num_experts=n_exp, experts_per_token=2,
                      expert_intermediate_size=inter, norm_topk_prob=True)
    moe = MoE(cfg, torch.float32)
    with torch.no_grad():
        moe.router.copy_(torch.from_numpy(rng.standard_normal((n_exp, hidden)).astype(np.float32)))
    for expert in moe.experts:
        expert.gate_up = linear_from([_expert_matrix(fmt, 2 * inter, hidden, rng)], None)
        expert.down = linear_from([_expert_matrix(fmt, hidden, inter, rng)], None)
    h = torch.from_numpy(rng.standard_normal((13, hidden)).astype(np.float32))
    x0 = torch.from_numpy(rng.standard_normal((13, hidden)).astype(np.float32))
    weights, ids = moe.route(h)
    assert len(torch.unique(ids)) > 2  # the batch spreads over the experts
    want = x0.clone()
    for t in range(h.shape[0]):
        for slot in torch.argsort(ids[t]).tolist():  # ascending expert id
            y = moe.experts[int(ids[t, slot])](h[t:t + 1])[0]
            want[t] += weights[t, slot] * y
    got = x0.clone()
    fused._moe(_Holder(), moe, _LibStep(), h, got)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
    one = x0[5:6].clone()  # a row's result does not depend on its batch
    fused._moe(_Holder(), moe, _LibStep(), h[5:6].contiguous(), one)
    assert torch.equal(one[0], got[5])
    big = torch.cat([x0] * 24)  # 312 rows: past the decode path's bound (all experts' GEMMs in one
    fused._moe(_Holder(), moe, _LibStep(), torch.cat([h] * 24), big)  # loop), expert by expert
    assert torch.equal(big[13 * 23 + 5], got[5]) and torch.equal(big[:13], got)
    eager = x0 + moe(h)  # the torch path: the same experts, the same weights
    torch.testing.assert_close(eager, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


class _Holder:
    def __init__(self):
        self.fused_cache = {}


class _LibStep:
    lib = native.load()


@needs_native
def test_moe_engine_batches_like_one_sequence(family):
    """Batched, chunked and speculative engine steps over quantized experts (rows of one step
    routed to different experts, the grouped kernel in the all-layers call) == each sequence
    alone, token for token: the grouped kernel is batch-invariant."""
    from agentrt.config import EngineConfig
    from agentrt.engine.core import EngineCore
    from tests.engine_util import drain, submit

    name, _, root, _ = family
    model = load_model(str(root / "q8.gguf"), quantize="native").model
    core = EngineCore(model, EngineConfig(kv_cache_tokens=4096, chunk_min=16, chunk_max=16, n_batch=16,
                                          response_cache_size=0))
    g = torch.Generator().manual_seed(5)
    work = [(torch.randint(0, 320, (n,), generator=g).tolist() * 2, SamplingParams(max_tokens=10))
            for n in (7, 19, 41)]
    reqs = [submit(core, p, sp) for p, sp in work]
    drain(core)
    for r, (p, sp) in zip(reqs, work):
        assert r.output == generate(model, p, sp)
