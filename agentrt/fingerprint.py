"""Content fingerprints: 64-bit FNV-1a over token ids (prefix-group keys, response-cache keys,
call ids)."""

from __future__ import annotations

FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3


def fnv1a(tokens: list[int]) -> int:
    """64-bit FNV-1a over the tokens' 4-byte little-endian encodings."""
    h = FNV_OFFSET
    for t in tokens:
        for b in (t & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h
