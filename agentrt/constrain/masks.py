"""Token masks as int32 bitmask words (bit i % 32 of word i // 32 allows token i): the words a
vocabulary needs, single bits, and a mask applied to a logits row."""

from __future__ import annotations

import numpy as np
import torch

from agentrt.kernels import native


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def low_bits(n: int) -> np.int32:
    """An int32 word with its n lowest bits set."""
    return np.array([(1 << n) - 1], dtype=np.uint32).view(np.int32)[0]


def bit(i: int) -> int:
    return -(1 << 31) if i == 31 else 1 << i  # int32 two's complement


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [V] in place: -inf where the token's bit is 0 (bit i % 32 of int32 word i // 32).

    `bitmask` is a CPU int32 [1, >= ceil(V / 32)]. An all-ones mask (free text) costs a scan of
    the words only. On CPU the compiled kernel stores -inf under each word's zero bits (masked
    AVX-512 stores: a few us for a 49k row, whatever the pattern); without it the bits are
    unpacked with numpy and selected with torch.where (~75 us; np.copyto(where=) is branchy:
    26-350 us depending on the mask, xgrammar's CPU kernel 24-300 us).
    """
    if logits.device.type == "cpu" and native.apply_bitmask(logits, bitmask[0]):
        return
    words = bitmask.numpy()[0]
    if (words == -1).all():
        return
    width = logits.shape[-1]
    if logits.device.type == "cpu":
        bits = np.unpackbits(words.view(np.uint8), count=width, bitorder="little")
        allowed = torch.from_numpy(bits.view(np.bool_))
        torch.where(allowed, logits, torch.tensor(float("-inf"), dtype=logits.dtype), out=logits)
        return
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    device_words = bitmask[0].to(logits.device, non_blocking=True)
    allowed = ((device_words.unsqueeze(-1) >> shifts) & 1).view(-1)[:width].bool()
    logits.masked_fill_(~allowed, float("-inf"))
