"""The on-disk form of a session snapshot (`Session.snapshot`, `Engine.restore`).

A snapshot holds one `torch.save` body of plain values only (a dict of str/int/float/list and
tensors), so it loads with `torch.load(weights_only=True)`: reading a file never runs code from
it. It holds the token ids a session's KV covers, that KV per token ([layers, tokens, Hkv, D],
independent of the page size of the engine that wrote it) and the *fingerprint* of the model
that computed it (model/fingerprint.py). KV is only meaningful for the exact model and dtype that produced it: restored
on another one, generation would go on silently wrong. So reading compares fingerprints and
refuses any difference with SnapshotMismatch, naming what differs.

Writing is atomic (a temporary file in the same directory, then os.replace): a crash or a full
disk never leaves a half-written snapshot under the final name. The file is a magic line, a
BLAKE2b checksum of every byte that follows, then the `torch.save` bytes; reading verifies the
checksum before loading and refuses any difference (SnapshotMismatch): one flipped byte in the
KV would otherwise restore silently and the next turn would run on corrupted KV.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

from agentrt.errors import ConfigError, SnapshotMismatch
from agentrt.state.records import atomic_write

FORMAT = "agentrt-session-snapshot"
VERSION = 2  # 2: framed with a checksum
MAGIC = b"agentrt-session-snapshot/2 blake2b-128 "  # then the body's hex digest, a newline, the body


def check_path(path: Any) -> Path:
    """A str or os.PathLike naming a file -> Path (ConfigError otherwise)."""
    if isinstance(path, (bytes, bytearray)) or not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    p = Path(path)
    if not str(path) or p.name in ("", ".", ".."):
        raise ConfigError(f"path must name a file, got {str(path)!r}")
    return p


def check_target(path: Any) -> Path:
    """check_path, and the directory to write into exists (checked before any KV is gathered)."""
    path = check_path(path)
    if not path.parent.is_dir():
        raise ConfigError(f"cannot write a snapshot to {path}: the directory {path.parent} does not exist; "
                          "create it first")
    return path


def write_snapshot(path: Any, data: dict, fingerprint: dict) -> Path:
    """Write {tokens, k, v, tag} (from Branching.export) with the fingerprint, atomically."""
    path = check_target(path)
    payload = {"format": FORMAT, "version": VERSION, "fingerprint": fingerprint,
               "tokens": [int(t) for t in data["tokens"]], "k": data["k"], "v": data["v"], "tag": data.get("tag")}
    if data.get("local_absent") is not None:
        payload["local_absent"] = data["local_absent"]
    if data.get("adapter") is not None:  # (the LoRA that computed its KV: {name, fingerprint, start})
        payload["adapter"] = dict(data["adapter"])
    buf = io.BytesIO()
    torch.save(payload, buf)
    body = buf.getvalue()
    atomic_write(path, [MAGIC + _digest(body) + b"\n", body])
    return path


def read_snapshot(path: Any, fingerprint: dict) -> dict:
    """The snapshot at `path` as {tokens, k, v, tag}, if `fingerprint` (this engine's model)
    wrote it; SnapshotMismatch for a missing, unreadable, foreign or mismatched file."""
    path = check_path(path)
    if not path.is_file():
        raise SnapshotMismatch(f"no session snapshot at {path}: the file does not exist; check the path "
                               "(Session.snapshot(path) writes one)")
    raw = path.read_bytes()
    framed = raw.startswith(MAGIC)
    body = raw
    if framed:
        digest, _, body = raw[len(MAGIC):].partition(b"\n")
        if digest != _digest(body):
            raise SnapshotMismatch(f"{path} is corrupt: its checksum does not match its contents (a changed, "
                                   "damaged or missing byte); restoring it would run on wrong KV. Write a new "
                                   "snapshot")
    try:
        obj = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as e:
        raise SnapshotMismatch(f"{path} is not a readable agentrt session snapshot ({type(e).__name__}: "
                               f"{str(e)[:120]}); it is corrupt or another kind of file: write a new one "
                               "with Session.snapshot") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise SnapshotMismatch(f"{path} is not an agentrt session snapshot (no {FORMAT!r} marker); "
                               "restore only files written by Session.snapshot")
    if obj.get("version") != VERSION or not framed:
        raise SnapshotMismatch(f"{path} has snapshot format version {obj.get('version')!r}; this agentrt reads "
                               f"version {VERSION}: write it again with this version")
    _check_fingerprint(path, obj.get("fingerprint"), fingerprint)
    return _check_payload(path, obj, fingerprint)


def _digest(body: bytes) -> bytes:
    """The hex BLAKE2b-128 of a snapshot's body."""
    return hashlib.blake2b(body, digest_size=16).hexdigest().encode()


def _check_fingerprint(path: Path, got: Any, want: dict) -> None:
    if not isinstance(got, dict):
        raise SnapshotMismatch(f"{path} has no model fingerprint; it is corrupt: write a new snapshot")
    diffs = []
    gc, wc = got.get("config") or {}, want["config"]
    for key in sorted(set(gc) | set(wc)):
        if gc.get(key) != wc.get(key):
            diffs.append(f"{key}: snapshot {gc.get(key)!r}, this model {wc.get(key)!r}")
    for key in ("dtype", "kv_dtype"):
        if got.get(key) != want[key]:
            diffs.append(f"{key}: snapshot {got.get(key)!r}, this model {want[key]!r}")
    if not diffs and got.get("weights") != want["weights"]:
        diffs.append(f"weights: same architecture and dtype but different weights (digest "
                     f"{got.get('weights')!r} vs {want['weights']!r})")
    if diffs:
        raise SnapshotMismatch(f"{path} was written by another model, so its KV is meaningless here ("
                               + "; ".join(diffs) + "). Restore it on an engine running the model (and dtype) "
                               "that wrote it, or start a fresh session")


def _check_payload(path: Path, obj: dict, fingerprint: dict) -> dict:
    """Shapes, dtypes and token ids consistent with the model: a file that passes is safe to copy in."""
    cfg, dtype = fingerprint["config"], getattr(torch, fingerprint["kv_dtype"])
    tokens, k, v = obj.get("tokens"), obj.get("k"), obj.get("v")
    n = len(tokens) if isinstance(tokens, list) else -1
    shape = (cfg["num_layers"], n, cfg["num_kv_heads"], cfg["head_dim"])
    ok = isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < cfg["vocab_size"]
                        for t in tokens)
    ok = ok and n <= cfg["max_position_embeddings"]
    ok = ok and all(isinstance(x, torch.Tensor) and tuple(x.shape) == shape and x.dtype == dtype for x in (k, v))
    tag, absent, adapter = obj.get("tag"), obj.get("local_absent"), obj.get("adapter")
    ok = ok and (absent is None or (isinstance(absent, torch.Tensor) and absent.dtype == torch.bool
                                    and tuple(absent.shape) == (n,)))
    ok = ok and (adapter is None or (isinstance(adapter, dict) and isinstance(adapter.get("fingerprint"), str)
                                     and isinstance(adapter.get("start"), int) and isinstance(adapter.get("name"), str)))
    if not ok or not (tag is None or isinstance(tag, str)):
        raise SnapshotMismatch(f"{path} is corrupt: its tokens and KV tensors do not agree with each other or "
                               "with the model; write a new snapshot")
    return {"tokens": tokens, "k": k, "v": v, "tag": tag, "local_absent": absent, "adapter": adapter}
