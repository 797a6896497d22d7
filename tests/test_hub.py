"""Models by name (`hf://...`, agentrt/model/loaders/hub.py) from a Hugging Face cache laid out as
`huggingface_hub` lays it out (refs, snapshots, blobs named by sha256), with HF_HUB_OFFLINE=1:
there is no network here. Oracle: the model loaded by name decodes the same tokens as the same
file loaded by path; errors say how to pull."""

from __future__ import annotations

import hashlib
import os

import pytest

from agentrt import SamplingParams, load_model
from agentrt.cli import main as cli
from agentrt.errors import ConfigError, CorruptModelFile, ModelNotFound
from agentrt.model.generate import generate
from agentrt.model.loaders.files import resolve_source
from agentrt.model.loaders.hub import parse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _put(cache, repo: str, files: dict[str, bytes], commit: str = COMMIT) -> None:
    """A repo in the cache: refs/main -> commit, snapshots/<commit>/<file> -> ../../blobs/<sha256>."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf") / "hub"
    gguf = resolve_source("smollm2-135m").read_bytes()
    _put(cache, "acme/smol-gguf", {"smol.gguf": gguf})
    _put(cache, "acme/dir-model", {"config.json": b"{}", "tokenizer.json": b"{}"})
    bad = cache / "models--acme--broken"
    _put(cache, "acme/broken", {"smol.gguf": gguf[:4096]})
    blob = next((bad / "blobs").iterdir())
    blob.write_bytes(b"GGUF" + b"\0" * 4092)  # damaged after download: content no longer hashes to its name
    return cache


@pytest.fixture
def offline(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))


def test_a_gguf_by_name_is_the_same_model_as_by_path(offline, embedded):
    lm = load_model("hf://acme/smol-gguf/smol.gguf", quantize="none")
    prompt = lm.tokenizer.encode("The capital of France is")
    params = SamplingParams(max_tokens=6)
    assert generate(lm.model, prompt, params) == generate(embedded.model, prompt, params)
    pinned = resolve_source(f"hf://acme/smol-gguf@{COMMIT}/smol.gguf")
    assert pinned.name == "smol.gguf" and COMMIT in str(pinned)


def test_a_directory_by_name(offline, cache):
    path = resolve_source("hf://acme/dir-model")
    assert path.is_dir() and (path / "config.json").is_file() and COMMIT in str(path)


def test_a_missing_model_says_how_to_pull_it(offline):
    for name in ("hf://acme/smol-gguf/other.gguf", "hf://acme/nothing/x.gguf", f"hf://acme/smol-gguf@{'f' * 40}/smol.gguf"):
        with pytest.raises(ModelNotFound, match="agentrt pull"):
            load_model(name)


def test_a_damaged_download_is_refused(offline):
    with pytest.raises(CorruptModelFile, match="sha256"):
        load_model("hf://acme/broken/smol.gguf")


def test_pull_and_bad_names(offline, cache, capsys):
    assert cli(["pull", "hf://acme/smol-gguf/smol.gguf"]) == 0  # offline: checks what the cache holds
    assert capsys.readouterr().out.strip().endswith("smol.gguf")
    assert cli(["pull", "hf://acme/nothing/x.gguf"]) == 2
    assert "agentrt pull" in capsys.readouterr().err
    for bad in ("hf://", "hf://onlyorg", "hf://org/repo@/x"):
        with pytest.raises(ConfigError, match="hf://<org>/<repo>"):
            parse(bad)
