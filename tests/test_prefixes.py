"""agentrt.prefixes.common_prefix, the one longest-common-prefix helper, against a plain loop."""

from __future__ import annotations

import random

from agentrt.prefixes import common_prefix


def _loop(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_equals_the_plain_loop():
    rng = random.Random(0)
    for _ in range(2000):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = a[:rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(6))]
        assert common_prefix(a, b) == _loop(a, b) == common_prefix(b, a)
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2
