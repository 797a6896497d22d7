"""A lean GGUF (v2/v3) reader: metadata as plain Python values, tensors as zero-copy views of a
memory map. gguf-py's `GGUFReader` builds a numpy view per array element (the 49k-token vocab
alone is ~150k of them: ~2.5 s per load here); this parser reads the same header in ~0.1 s.
Layout (llama.cpp's gguf.md): magic, version u32, tensor count u64, kv count u64; kv pairs
(string key, u32 type, value); tensor infos (name, n_dims u32, dims u64[n], type u32, offset
u64); tensor data from the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9
_NATIVE = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
           GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
           GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
           GGMLQuantizationType.I64: np.int64}


class GGUFFormatError(ValueError):
    """The bytes are not a well-formed GGUF file (the loader turns it into CorruptModelFile)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF order: fastest-moving dimension first
    data_offset: int  # absolute, in the file
    n_bytes: int
    data: np.ndarray  # a view of the memory map (native dtype, or raw block bytes [rows, row_bytes])


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise GGUFFormatError("a string runs past the end of the file")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            return self.array()
        raise GGUFFormatError(f"unknown metadata value type {kind}")

    def array(self) -> list | None:
        kind, count = self.take("<I"), self.take("<Q")
        if count > len(self.buf) - self.pos:  # every element takes at least one byte
            raise GGUFFormatError(f"an array of {count} elements cannot fit in the file")
        if kind in _NP:
            arr: np.ndarray = np.frombuffer(self.buf, dtype=_NP[kind], count=count, offset=self.pos)
            self.pos += arr.nbytes
            return arr.tolist()
        if kind == _STRING:
            return [self.string() for _ in range(count)]
        items = [self.value(kind) for _ in range(count)]  # nested arrays: parsed, not used
        return None if kind == _ARRAY else items


class GGUFFile:
    """`fields`: metadata key -> value; `tensors`: TensorInfo in file order."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._parse(memoryview(self._map))
        except (struct.error, ValueError, KeyError, IndexError, OverflowError, MemoryError) as exc:
            raise GGUFFormatError(str(exc) or type(exc).__name__) from exc

    def release(self, offset: int, n_bytes: int) -> None:
        """Drop this process's pages of bytes [offset, offset + n_bytes) of the file (read, and
        copied: a later read faults them in again from the page cache), so that what a load has
        read does not stay in its resident set."""
        page = mmap.PAGESIZE
        start, end = offset // page * page, -(-(offset + n_bytes) // page) * page
        # the stdlib mmap's madvise: absent on some platforms (Windows)
        if end > start and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, start, min(end, len(self._map)) - start)

    def _parse(self, buf) -> None:
        cur = _Cursor(buf)
        if bytes(buf[:4]) != b"GGUF":
            raise GGUFFormatError("bad magic")
        cur.pos = 4
        version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} is not supported (2 or 3)")
        self.fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            self.fields[key] = cur.value(cur.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = cur.string(), cur.take("<I")
            dims = [cur.take("<Q") for _ in range(n_dims)]
            infos.append((name, dims, GGMLQuantizationType(cur.take("<I")), cur.take("<Q")))
        align = int(self.fields.get("general.alignment", 32) or 32)
        start = -(-cur.pos // align) * align
        self.tensors = [self._tensor(buf, start, *info) for info in infos]

    def _tensor(self, buf, start: int, name: str, dims: list[int], qtype, offset: int) -> TensorInfo:
        block, size = GGML_QUANT_SIZES[qtype]
        n = int(np.prod(dims)) if dims else 1
        n_bytes = n // block * size
        at = start + offset
        if at + n_bytes > len(buf):
            raise GGUFFormatError(f"tensor {name} extends past the end of the file; it is truncated")
        shape = tuple(reversed(dims))
        if qtype in _NATIVE:
            data = np.frombuffer(buf, dtype=_NATIVE[qtype], count=n, offset=at).reshape(shape)
        else:  # raw blocks: one row of bytes per matrix row
            data = np.frombuffer(buf, dtype=np.uint8, count=n_bytes, offset=at)
            data = data.reshape(*shape[:-1], dims[0] // block * size)
        return TensorInfo(name, qtype, np.array(dims, dtype=np.uint64), at, n_bytes, data)
