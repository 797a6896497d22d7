"""Models by name from the Hugging Face Hub, through `huggingface_hub` and its cache.

    load_model("hf://bartowski/Qwen2.5-0.5B-Instruct-GGUF/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf")
    load_model("hf://Qwen/Qwen2.5-0.5B-Instruct")              # a model directory (safetensors)
    load_model("hf://org/repo@<commit or tag>/file.gguf")      # pinned to a revision
    agentrt pull hf://org/repo/file.gguf                       # download (and check) ahead of time

A name is `hf://<org>/<repo>[@<revision>][/<file.gguf>]`. Files go to (and come from)
huggingface_hub's cache (`HF_HUB_CACHE` / `HF_HOME`, revisions pinned as it pins them); with
`HF_HUB_OFFLINE=1` nothing is fetched and only the cache is read. A file the hub stores with LFS
is named in the cache by its sha256: it is checked against its content on every resolve (the
hash is cached per process), so a damaged or replaced download is CorruptModelFile, never a
model loaded from wrong bytes. A name not in the cache while offline is ModelNotFound that says
how to pull it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentrt.errors import ConfigError, CorruptModelFile, ModelNotFound
from agentrt.model.loaders.checksums import verify_file

_NAME = re.compile(r"^hf://(?P<repo>[\w.\-]+/[\w.\-]+)(?:@(?P<rev>[\w.\-]+))?(?:/(?P<file>[^@]+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# what a model directory needs (weights, config, tokenizer, chat template), not the repo's extras
DIRECTORY_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


@dataclass(frozen=True)
class HubName:
    repo: str
    revision: str | None
    file: str | None  # None: the model directory


def parse(name: str) -> HubName:
    """`hf://org/repo[@revision][/file]` -> its parts; ConfigError for a malformed name."""
    m = _NAME.match(name)
    if m is None:
        raise ConfigError(f"{name!r} is not a hub name: write hf://<org>/<repo>[@<revision>][/<file.gguf>]")
    return HubName(m["repo"], m["rev"], m["file"])


def is_hub_name(source: object) -> bool:
    return isinstance(source, str) and source.startswith("hf://")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(name: str, *, download: bool | None = None) -> Path:
    """The local path of a hub name: from the cache, else downloaded (unless offline)."""
    hub = _hub()
    n = parse(name)
    local_only = offline() or download is False  # (pull while offline: checks the cache)
    cache_dir = os.environ.get("HF_HUB_CACHE") or None
    try:
        if n.file is not None:
            path = Path(hub.hf_hub_download(n.repo, n.file, revision=n.revision, cache_dir=cache_dir,
                                            local_files_only=local_only))
            verify_blob(path)
            return path
        return Path(hub.snapshot_download(n.repo, revision=n.revision, cache_dir=cache_dir,
                                          allow_patterns=DIRECTORY_FILES, local_files_only=local_only))
    except (hub.errors.LocalEntryNotFoundError, hub.errors.EntryNotFoundError,
            hub.errors.RepositoryNotFoundError, hub.errors.RevisionNotFoundError) as e:
        how = ("it is not in the Hugging Face cache and HF_HUB_OFFLINE is set: pull it where the hub can be "
               f"reached with `agentrt pull {name}` (the same HF_HOME / HF_HUB_CACHE), or unset HF_HUB_OFFLINE"
               if local_only else "check the repository, revision and file name on the hub")
        raise ModelNotFound(f"no model {name!r}: {how} ({type(e).__name__})") from None
    except OSError as e:  # no network, a proxy, a full disk
        raise ModelNotFound(f"cannot fetch {name!r}: {e}; with no network, pull it elsewhere into the cache and "
                            "set HF_HUB_OFFLINE=1") from None


def verify_blob(path: Path) -> None:
    """CorruptModelFile unless an LFS file's content hashes to the sha256 it is stored under."""
    blob = path.resolve()
    if _SHA256.match(blob.name):
        try:
            verify_file(blob, size=blob.stat().st_size, sha256=blob.name)
        except CorruptModelFile as e:
            raise CorruptModelFile(f"{path}: the cached download does not match its sha256 ({e}); delete it and "
                                   "pull it again") from None


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:
        raise ConfigError("hf:// names need huggingface_hub: pip install huggingface_hub") from e
    return huggingface_hub
