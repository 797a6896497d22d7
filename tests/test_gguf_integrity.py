"""Model file integrity: a GGUF whose tensor bytes are damaged but of the right size (a NaN in an
f32 weight, an Inf fp16 scale in a Q8_0 block) raises CorruptModelFile naming the tensor, on the
dense and the native (kept quantized) load paths, instead of loading garbage silently."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from agentrt.errors import CorruptModelFile
from agentrt.model.loaders.gguf import check_finite, load_gguf
from agentrt.model.loaders.gguf_reader import GGUFFile
from agentrt.model.loaders.load import load_model
from tests.test_gguf_loader import _gguf_name, _tiny, _write_gguf

Q8_NAME = "blk.0.ffn_up.weight"


def _poke(path: Path, tensor: str, at: int, data: bytes) -> None:
    """Overwrite bytes of `tensor`'s data in place (same size: the header stays valid)."""
    info = next(t for t in GGUFFile(path).tensors if t.name == tensor)
    assert at + len(data) <= info.n_bytes
    with open(path, "r+b") as fh:
        fh.seek(info.data_offset + at)
        fh.write(data)


def _tiny_file(tmp_path: Path) -> Path:
    config, weights = _tiny("llama", tied=True)
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, config, weights)
    return path


def _write_q8(path: Path, config, weights, q8: np.ndarray) -> None:
    """Like _write_gguf, plus one matrix as raw Q8_0 blocks (34 bytes: fp16 d, 32 x int8)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    for name, w in weights.items():
        writer.add_tensor(_gguf_name(name), w.numpy())
    writer.add_tensor(Q8_NAME, q8, raw_dtype=T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def q8_file(tmp_path):
    config, weights = _tiny("llama", tied=True)
    w = weights.pop("model.layers.0.mlp.up_proj.weight").numpy()
    path = tmp_path / "q8.gguf"
    _write_q8(path, config, weights, gguf.quants.quantize(w, T.Q8_0))
    return path


@pytest.mark.parametrize("native", [False, True])
def test_nan_in_f32_tensor_raises_corrupt_model_file(tmp_path, native):
    path = _tiny_file(tmp_path)
    load_gguf(path, native=native)  # intact: loads
    _poke(path, "blk.1.attn_v.weight", 4 * 17, struct.pack("<f", float("nan")))
    with pytest.raises(CorruptModelFile, match=r"blk\.1\.attn_v\.weight.*NaN/Inf.*re-download") as err:
        load_gguf(path, native=native)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("native", [False, True])
def test_inf_scale_in_q8_0_block_raises_corrupt_model_file(q8_file, native):
    """Dequantized: when the file is read. Kept quantized: when the model reads the matrix
    (loaders/lazy.py: matrices are read as they are packed), with the file's path."""
    load = (lambda: load_model(str(q8_file), quantize="native")) if native else (lambda: load_gguf(q8_file))
    load()  # intact: loads
    block = 3  # the fp16 d of the 4th block: +Inf
    _poke(q8_file, Q8_NAME, 34 * block, np.array([np.inf], dtype=np.float16).tobytes())
    what = "block scales" if native else "weights"
    with pytest.raises(CorruptModelFile, match=rf"{Q8_NAME}.*Q8_0.*NaN/Inf {what}.*re-download") as err:
        load()
    assert str(q8_file) in str(err.value)


def test_inf_in_f16_tensor_raises(tmp_path):
    config, weights = _tiny("llama", tied=True)
    weights = {n: w.half() if w.dim() == 2 else w for n, w in weights.items()}
    path = tmp_path / "f16.gguf"
    _write_gguf(path, config, weights)
    load_gguf(path)
    _poke(path, "token_embd.weight", 2 * 5, np.array([-np.inf], dtype=np.float16).tobytes())
    with pytest.raises(CorruptModelFile, match="token_embd.weight"):
        load_gguf(path)


def test_check_finite_large_but_finite_values_pass():
    class Info:
        name, tensor_type = "x", T.F32

    big = np.full(1000, 3e38, dtype=np.float32)  # the sum overflows; the values are finite: fine
    check_finite(Info, big)
    check_finite(Info, np.zeros(0, dtype=np.float32))
    with pytest.raises(CorruptModelFile, match=r"x \(F32\) has 2 NaN/Inf values \(first at index \(1,\)\)"):
        check_finite(Info, np.array([0, np.nan, 1, -np.inf], dtype=np.float32))


def test_check_on_the_embedded_model_is_one_pass_per_array():
    """The check is one float64 sum per tensor (and per quantized block's scales and minimums):
    at most three arrays per tensor, each seen once (its cost is printed, never asserted)."""
    from gguf import GGUFReader

    from agentrt.model.loaders import gguf as gguf_loader
    from agentrt.model.loaders import lazy
    from agentrt.model.loaders.files import resolve_source

    try:
        path = resolve_source("smollm2-135m")
    except Exception as exc:  # noqa: BLE001 - the embedded model package is optional
        pytest.skip(f"embedded model not installed: {exc}")
    calls = []
    original = gguf_loader.check_finite

    def timed(tensor, values, *a, **kw):
        t = time.perf_counter()
        try:
            return original(tensor, values, *a, **kw)
        finally:
            calls.append((tensor.name, time.perf_counter() - t))

    gguf_loader.check_finite = lazy.check_finite = timed  # (dense tensors; quantized ones as read)
    try:
        t = time.perf_counter()
        load_model(str(path), quantize="native")
        total = time.perf_counter() - t
    finally:
        gguf_loader.check_finite = lazy.check_finite = original
    spent = sum(dt for _, dt in calls)
    print(f"integrity check: {spent * 1e3:.1f} ms of {total * 1e3:.0f} ms load ({len(calls)} arrays)")
    names = {t.name for t in GGUFReader(str(path)).tensors}
    per_tensor = {n: sum(1 for m, _ in calls if m == n) for n in names}
    assert all(1 <= k <= 3 for k in per_tensor.values()), per_tensor
