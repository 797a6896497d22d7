"""Random-weight GGUF files of realistic shapes for the benchmarks: written with gguf's writer,
tokenized by the embedded SmolLM2 tokenizer (copied into each file), so llama.cpp loads them as
it would a real model. Files go to ~/.cache/agentrt/bench, written once per shape."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "agentrt" / "bench"


def cached_gguf(name: str, write: Callable[[Path], None]) -> Path:
    """CACHE/name, written by `write(path)` on first use (atomically)."""
    path = CACHE / name
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write(tmp)
        tmp.replace(path)
    return path


def new_writer(path: Path, arch: str, name: str, s: dict, ffn: int):
    """A GGUFWriter for `arch` with the shape keys every benchmark file shares (s: layers, hidden,
    heads, kv_heads, head_dim), an 8k context, RoPE base 1e6 and RMSNorm eps 1e-6."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(s["layers"])
    w.add_context_length(8192)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(ffn)
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    return w


def add_smollm2_tokenizer(w) -> int:
    """Copy the embedded SmolLM2 GGUF's tokenizer and chat template into writer `w`; its vocab size."""
    from agentrt.model.loaders.files import resolve_source
    from agentrt.model.loaders.gguf_reader import GGUFFile

    tok = GGUFFile(resolve_source("smollm2-135m")).fields
    w.add_tokenizer_model(tok["tokenizer.ggml.model"])
    w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    w.add_token_list(tok["tokenizer.ggml.tokens"])
    w.add_token_types(tok["tokenizer.ggml.token_type"])
    w.add_token_merges(tok["tokenizer.ggml.merges"])
    w.add_bos_token_id(tok["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(tok["tokenizer.ggml.eos_token_id"])
    w.add_pad_token_id(tok["tokenizer.ggml.padding_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(tok["tokenizer.chat_template"])
    return len(tok["tokenizer.ggml.tokens"])


def q4k_blocks(rows: int, cols: int, rng) -> np.ndarray:
    """Random Q4_K blocks [rows, bytes] (gguf has no K quantizer): d ~ U(1e-4, 5e-4) and
    dmin = 7.5 d, so that weights centre on 0."""
    blocks = rng.integers(0, 256, (rows * cols // 256, 144), dtype=np.uint8)
    d = rng.uniform(1e-4, 5e-4, blocks.shape[0]).astype(np.float32)
    blocks[:, 0:4] = np.stack([d, 7.5 * d], 1).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def finish(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
