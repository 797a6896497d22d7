"""A disk KV record's file: the K and V of a run of tokens, checksummed, written crash-safely.

Layout: a magic line, a JSON header line (record id, shape, dtype, body size), the CRC-32s of
the header and of the body in hex, a newline, then K's and V's raw bytes ([layers, n, Hkv,
D] each, C order). Reading recomputes the checksum and compares the header with what the caller
expects; any difference (a torn write, a flipped byte, another record's file under this name)
raises CorruptRecord, and the caller recomputes those tokens instead.

Writing: a temporary file in the same directory, fsync, rename onto the final name, fsync of
the directory; only then does the caller add the index row (state/sql.py). So after SIGKILL at
any moment a name in the index always has its complete file; a file without a row is swept.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import torch

_POPULATE = mmap.MAP_POPULATE if sys.platform == "linux" else 0  # (fault the pages in with the map)
MAGIC = b"agentrt-kv-record/2\n"  # 2: CRC-32 checksums, the body's size in the header


class CorruptRecord(Exception):
    """A record file that is missing, torn or not the record its index row names."""


def write_record(path: Path, rid: str, k: torch.Tensor, v: torch.Tensor) -> int:
    """Write K and V ([layers, n, Hkv, D], same dtype) as record `rid` at `path`; returns bytes.
    (Straight from the tensors' memory: no joined copy.)"""
    parts = [_raw(k), _raw(v)]
    size = sum(len(p) for p in parts)
    header = json.dumps({"id": rid, "shape": list(k.shape), "dtype": str(k.dtype).removeprefix("torch."),
                         "bytes": size}, sort_keys=True).encode()
    digest = _digest(header, *parts)
    atomic_write(path, [MAGIC + header + b"\n" + digest + b"\n", *parts])
    _fsync_dir(path.parent)
    return len(MAGIC) + len(header) + len(digest) + 2 + size


def atomic_write(path: Path, chunks) -> None:
    """Write `chunks` (bytes-like, in order) as the file `path`, all or nothing: a temporary
    file in the same directory, fsync, then a rename onto the name (a crash or a full disk never
    leaves a part of it under `path`). Snapshots (kv/snapshot.py) and KV records use it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: Path, rid: str, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of record `rid` at `path`, checked (CorruptRecord for any difference). The file
    is mapped (its pages faulted in at once) and the tensors are read-only views of the map: no
    copy until the caller scatters them into KV pages."""
    try:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    except (OSError, ValueError) as e:  # (ValueError: an empty file)
        raise CorruptRecord(f"{path}: cannot read ({e})") from None
    view = memoryview(buf)
    if bytes(view[:len(MAGIC)]) != MAGIC:
        raise CorruptRecord(f"{path}: not a KV record")
    head_end = buf.find(b"\n", len(MAGIC))
    dig_end = buf.find(b"\n", head_end + 1)
    if head_end < 0 or dig_end < 0:
        raise CorruptRecord(f"{path}: torn header")
    header, body = bytes(view[len(MAGIC):head_end]), view[dig_end + 1:]
    if _digest(header, body) != bytes(view[head_end + 1:dig_end]):
        raise CorruptRecord(f"{path}: checksum mismatch (torn or damaged)")
    try:
        meta = json.loads(header)
    except ValueError:
        raise CorruptRecord(f"{path}: unreadable header") from None
    want = {"id": rid, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."), "bytes": len(body)}
    if meta != want:
        raise CorruptRecord(f"{path}: holds {meta}, expected {want}")
    with warnings.catch_warnings():  # (a read-only map: torch warns it cannot write it; nothing does)
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(buf, dtype=torch.uint8, offset=dig_end + 1, count=len(body))
    half = len(body) // 2
    return flat[:half].view(dtype).reshape(shape), flat[half:].view(dtype).reshape(shape)


def _digest(header: bytes, *body) -> bytes:
    """The record's checksum: CRC-32 of the header and of the body (its parts in order; a torn
    write or a flipped bit changes it; records are our own files, not adversarial input, so a
    fast CRC will do), as hex."""
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return f"{zlib.crc32(header):08x}{crc:08x}".encode()


def record_path(root: Path, rid: str) -> Path:
    """Where record `rid` lives under a state dir."""
    return Path(root) / "kv" / rid[:2] / f"{rid}.kv"


def forget_records(store, root: Path, ids) -> int:
    """Delete records: their index rows first (a reader never finds a row without its file),
    then their files; returns how many."""
    ids = list(ids)
    store.kv_delete(ids)
    for rid in ids:
        with contextlib.suppress(OSError):
            record_path(root, rid).unlink()
    return len(ids)


def forget_session(store, root: Path | None, key: str) -> int:
    """Drop session `key` from the registry, and the KV records only it ran through (records
    another session's history uses stay); returns records deleted."""
    row = store.delete_session(key)
    if row is None or root is None:
        return 0
    others = {rid for s in store.sessions() for rid in s.records}
    return forget_records(store, root, [r for r in row.records if r not in others])


def _raw(t: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes, without a copy where it is contiguous already."""
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().data.cast("B")


def _fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (POSIX: the directory entry is data of the directory)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def tmp_files(d: Path) -> list[Path]:
    """Temporary files a crash left behind in `d` (never renamed: never indexed)."""
    return [p for p in d.glob(".*.tmp")]
