"""LoRA adapters against their oracle, transformers + PEFT on the same tiny random model with
random non-zero adapters: logits within 1e-4 (fp32) per adapter (every target, a layer subset,
rank and alpha patterns, rsLoRA), for activated LoRA, and for one batch mixing four adapters and
the base model; on the eager and the fused (compiled kernels) forward. Bad files get typed errors."""

from __future__ import annotations

import json

import pytest
import torch

from agentrt.adapters import LoraStep, read_peft
from agentrt.errors import AdapterError, AdapterMismatch, UnsupportedAdapter
from agentrt.kernels import native
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from agentrt.model.decoder import DecoderModel
from agentrt.model.generate import prompt_logits
from agentrt.model.loaders.hf import load_hf_dir
from tests.conftest import make_hf_model

peft = pytest.importorskip("peft")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PATHS = ["eager"] + (["fused"] if native.available() else [])


def base(tmp_path, seed: int = 1):
    """The tiny HF model (the oracle's base) and our DecoderModel over the same weights."""
    hf = make_hf_model("llama", seed=seed)
    hf.save_pretrained(tmp_path / "base", safe_serialization=True)
    files = load_hf_dir(tmp_path / "base", torch.float32)
    model = DecoderModel(files.config)
    model.load_hf_weights(files.weights)
    return hf, model


def make_adapter(hf, where, seed: int, **cfg):
    """A PEFT LoRA on a deep copy of `hf`, with random non-zero A and B, saved to `where`;
    returns the PEFT model (the oracle)."""
    import copy

    torch.manual_seed(seed)
    config = peft.LoraConfig(**{"r": 4, "lora_alpha": 8, "target_modules": ALL, "init_lora_weights": False, **cfg})
    pm = peft.get_peft_model(copy.deepcopy(hf), config)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    pm.eval()
    pm.save_pretrained(where)
    return pm


def ids(n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, 301, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def oracle(pm, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return pm(torch.tensor([prompt])).logits[0]


CASES = {
    "all targets": {},
    "attention only, rank 8": {"r": 8, "lora_alpha": 4, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    "mlp only, rsLoRA": {"target_modules": ["gate_proj", "up_proj", "down_proj"], "use_rslora": True},
    "layer subset and patterns": {"layers_to_transform": [1], "rank_pattern": {"q_proj": 2},
                                  "alpha_pattern": {"down_proj": 3}},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", list(CASES))
def test_an_adapter_matches_peft(tmp_path, case, path):
    hf, model = base(tmp_path)
    pm = make_adapter(hf, tmp_path / "a", seed=7, **CASES[case])
    adapter = read_peft(tmp_path / "a", model.cfg, "a")
    prompt = ids(37)
    ours = prompt_logits(model, prompt, adapter=adapter, path=path)
    ref = oracle(pm, prompt)
    assert (ours - ref).abs().max().item() <= 1e-4
    plain = prompt_logits(model, prompt, path=path)  # (and the adapter changes the logits)
    assert (plain - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("path", PATHS)
def test_activated_lora_matches_peft_and_keeps_the_base_before_its_invocation(tmp_path, path):
    hf, model = base(tmp_path)
    inv = [17, 99, 5]
    pm = make_adapter(hf, tmp_path / "al", seed=8, alora_invocation_tokens=inv, task_type="CAUSAL_LM")
    adapter = read_peft(tmp_path / "al", model.cfg, "al")
    assert adapter.activated and adapter.invocation_tokens == tuple(inv)
    prompt = ids(30) + inv + ids(6, seed=4)
    ours = prompt_logits(model, prompt, adapter=adapter, path=path)
    assert (ours - oracle(pm, prompt)).abs().max().item() <= 1e-4
    plain = prompt_logits(model, prompt, path=path)
    start = adapter.activation_start(prompt)
    assert start == 30
    assert torch.equal(ours[:start], plain[:start]) and not torch.allclose(ours[start:], plain[start:])


@pytest.mark.parametrize("path", PATHS)
def test_one_batch_mixing_four_adapters_and_the_base_matches_each_alone(tmp_path, path):
    hf, model = base(tmp_path)
    oracles, adapters = [], []
    for i, case in enumerate(CASES.values()):
        oracles.append(make_adapter(hf, tmp_path / f"a{i}", seed=20 + i, **case))
        adapters.append(read_peft(tmp_path / f"a{i}", model.cfg, f"a{i}"))
    seqs = [ids(5 + 7 * i, seed=i) for i in range(5)]  # four adapters, then the base model
    kv = KVStore.allocate(model.cfg, 32, 16)
    chunks, page = [], 0
    for s, adapter in zip(seqs, [*adapters, None]):
        n = -(-len(s) // 16)
        chunks.append(SeqChunk(s, 0, list(range(page, page + n)), len(s), adapter=adapter))
        page += n
    fb = build_batch(chunks, 16)
    out = model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows, path=path, lora=LoraStep.of(chunks))
    got = out.split([len(s) for s in seqs])
    for s, pm, g in zip(seqs, oracles, got):
        assert (g - oracle(pm, s)).abs().max().item() <= 1e-4
    with torch.no_grad():
        assert (got[4] - hf(torch.tensor([seqs[4]])).logits[0]).abs().max().item() <= 1e-4


def test_the_fingerprint_is_the_content(tmp_path):
    hf, model = base(tmp_path)
    make_adapter(hf, tmp_path / "a", seed=7)
    make_adapter(hf, tmp_path / "b", seed=9)
    a, a2, b = (read_peft(tmp_path / d, model.cfg, n) for d, n in (("a", "x"), ("a", "y"), ("b", "x")))
    assert a.fingerprint == a2.fingerprint != b.fingerprint  # (names do not matter; weights do)
    conf = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    conf["lora_alpha"] = 16  # the same tensors at another scaling: another adapter
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(conf))
    assert read_peft(tmp_path / "a", model.cfg, "x").fingerprint != a.fingerprint


def test_bad_adapters_get_typed_errors(tmp_path):
    hf, model = base(tmp_path)
    with pytest.raises(AdapterError, match="adapter_config.json"):
        read_peft(tmp_path, model.cfg, "none")
    make_adapter(hf, tmp_path / "d", seed=1, use_dora=True)
    with pytest.raises(UnsupportedAdapter, match="DoRA"):
        read_peft(tmp_path / "d", model.cfg, "d")
    other = make_hf_model("llama", seed=2, hidden_size=48, intermediate_size=96)
    make_adapter(other, tmp_path / "o", seed=1)
    with pytest.raises(AdapterMismatch, match="do not fit"):
        read_peft(tmp_path / "o", model.cfg, "o")
    make_adapter(hf, tmp_path / "e", seed=1, target_modules=["q_proj", "embed_tokens"])
    with pytest.raises(UnsupportedAdapter, match="embed_tokens"):
        read_peft(tmp_path / "e", model.cfg, "e")
