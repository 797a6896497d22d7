"""llama.cpp's GGUF LoRA files: a PEFT adapter written as one (adapters/gguf_files.py, the layout of
llama.cpp's convert_lora_to_gguf.py) reads back as the same adapter (the same fingerprint in
f32, the same logits); its attn_q/attn_k rows are permuted as llama.cpp's llama architecture
wants; and llama.cpp itself (llama-cpp-python, where installed) runs the file on the embedded
GGUF with the effect agentrt computes from the PEFT directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrt.adapters import gguf_files
from agentrt.adapters.gguf_files import permute_rope_rows, read_gguf_lora, write_gguf_lora
from agentrt.adapters.registry import read_adapter
from agentrt.errors import AdapterError, AdapterMismatch, UnsupportedAdapter
from agentrt.model.generate import prompt_logits
from agentrt.model.loaders import gguf as base_loader
from tests.conftest import tiny_native
from tests.test_adapters import ids, make_adapter
from tests.test_adapters_engine import INVOCATION, NATIVE

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def peft_dirs(tmp_path_factory):
    from tests.conftest import make_hf_model

    root = tmp_path_factory.mktemp("gguf_lora")
    hf = make_hf_model("llama", seed=7, **NATIVE)
    make_adapter(hf, root / "plain", seed=3)
    make_adapter(hf, root / "alora", seed=4, alora_invocation_tokens=INVOCATION, task_type="CAUSAL_LM")
    make_adapter(hf, root / "rs", seed=5, use_rslora=True)
    return root


def test_the_permutation_is_llama_cpps_and_undone_on_reading():
    w = torch.arange(2 * 8 * 3).reshape(16, 3)  # 2 heads of 8 rows
    p = permute_rope_rows(w, 2)
    assert p[:, 0].tolist()[:8] == [0, 12, 3, 15, 6, 18, 9, 21]  # (row 0, 4, 1, 5, ...: halves interleaved)
    assert torch.equal(base_loader.unpermute_rope_rows(p, 2), w)  # (the base model's loader undoes it)
    assert torch.equal(gguf_files.unpermute_rope_rows(p, 2), w)
    assert gguf_files.PERMUTED_ARCHS == base_loader.PERMUTED_ARCHS


@pytest.mark.parametrize("outtype", ["f32", "bf16", "f16"])
def test_a_peft_adapter_written_as_gguf_reads_back_the_same(peft_dirs, tmp_path, outtype):
    model = tiny_native("llama")
    for name in ("plain", "alora"):
        path = write_gguf_lora(peft_dirs / name, model.cfg, tmp_path / f"{name}.gguf", outtype)
        ours = read_adapter(name, path, model)
        peft = read_adapter(name, peft_dirs / name, model)
        assert ours.meta["format"] == "gguf" and ours.invocation_tokens == peft.invocation_tokens
        assert ours.dtype == ("bfloat16" if outtype == "bf16" else "float32")
        if outtype == "f32":
            assert ours.fingerprint == peft.fingerprint  # (the same numbers: the same KV identity)
        prompt = ids(20) + INVOCATION + ids(5, seed=9)
        got, ref = prompt_logits(model, prompt, adapter=ours), prompt_logits(model, prompt, adapter=peft)
        effect = (ref - prompt_logits(model, prompt)).abs().max().item()
        tol = 0 if outtype == "f32" else 0.1 * effect  # (16-bit weights: rounding, not another adapter)
        assert (got - ref).abs().max().item() <= tol


def test_bad_gguf_adapters_get_typed_errors(peft_dirs, tmp_path):
    model = tiny_native("llama")
    with pytest.raises(UnsupportedAdapter, match="one alpha"):
        write_gguf_lora(peft_dirs / "rs", model.cfg, tmp_path / "rs.gguf")
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "base.gguf"), "llama")  # a model file, not an adapter
    w.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        step()
    with pytest.raises(AdapterError, match="not a LoRA adapter"):
        read_gguf_lora(tmp_path / "base.gguf", model.cfg, "x")
    path = write_gguf_lora(peft_dirs / "plain", model.cfg, tmp_path / "p.gguf")
    with pytest.raises(AdapterMismatch, match="architecture 'llama'"):
        read_gguf_lora(path, tiny_native("qwen2").cfg, "x")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(AdapterError, match="not a GGUF one"):
        read_adapter("x", tmp_path / "notes.txt", model)


def test_llama_cpp_runs_the_file_with_the_effect_agentrt_computes(tmp_path):
    """The independent check of the layout: llama.cpp's own loader and kernels, on the embedded
    GGUF, with a random rank-8 adapter on every projection."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from agentrt import load_model
    from bench.bench_adapters import write_adapter

    lm = load_model("smollm2-135m")
    cfg = lm.model.cfg
    peft = write_adapter(tmp_path / "a", cfg, seed=1, rank=8, scale=0.05)
    path = write_gguf_lora(peft, cfg, tmp_path / "a.gguf")
    prompt = lm.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    adapter = read_adapter("a", peft, lm.model)
    ours = prompt_logits(lm.model, prompt, adapter=adapter)[-1] - prompt_logits(lm.model, prompt)[-1]

    def last_logits(lora):
        llm = llama_cpp.Llama(str(Path(lm.source)), lora_path=lora, n_ctx=256, logits_all=True, verbose=False,
                              n_threads=2)
        llm.eval(prompt)
        return torch.tensor(llm.scores[len(prompt) - 1])

    theirs = last_logits(str(path)) - last_logits(None)
    assert ours.abs().max().item() > 1.0  # (the adapter moves the logits)
    corr = torch.corrcoef(torch.stack([ours, theirs]))[0, 1].item()
    assert corr > 0.98, corr
