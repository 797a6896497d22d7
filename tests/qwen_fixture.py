"""The real Qwen2.5 tokenizer and chat template (tests/fixtures/qwen2.5, no weights)."""

from __future__ import annotations

import lzma
import shutil
from pathlib import Path

from agentrt.model.loaders.hf import load_hf_tokenizer
from agentrt.model.tokenizer import Tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "qwen2.5"


def qwen_dir(tmp: Path) -> Path:
    """A directory with tokenizer.json (decompressed), tokenizer_config.json and chat_template.jinja."""
    out = tmp / "qwen2.5"
    if not (out / "tokenizer.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(FIXTURE / name, out / name)
        with lzma.open(FIXTURE / "tokenizer.json.xz") as src, open(out / "tokenizer.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def qwen_tokenizer(tmp: Path) -> Tokenizer:
    return load_hf_tokenizer(qwen_dir(tmp))
