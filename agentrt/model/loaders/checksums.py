"""File checksums: a model file's size and sha256 against what it should be."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from agentrt.errors import CorruptModelFile


@lru_cache(maxsize=32)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file; (size, mtime_ns) are part of the key so a changed file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, *, size: int, sha256: str) -> None:
    """Raise CorruptModelFile unless `path` has exactly this size and sha256 (hash cached per process)."""
    stat = path.stat()
    if stat.st_size != size:
        raise CorruptModelFile(
            f"{path} is {stat.st_size} bytes, expected {size}; the file is truncated or replaced, reinstall it"
        )
    actual = _file_sha256(str(path), stat.st_size, stat.st_mtime_ns)
    if actual != sha256:
        raise CorruptModelFile(f"{path} has sha256 {actual}, expected {sha256}; the file is damaged, reinstall it")
