"""The longest common prefix of two token-id lists, one definition below every room (the engine's
rooms import only downward, tests/test_structure.py): a session's rollback to what it holds and
the new prompt share, a radix tree's edge match, the benchmarks' prefix counts."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share. Slices compare in C, so a bisection over slice
    equality beats a Python loop over ids on long histories."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if a[:mid] == b[:mid] else (lo, mid)
    return lo
