"""Step cost models: what one engine step costs, from the shape of the batch it runs.

    seconds = base + per_seq * B + per_token * T + per_pair * A + per_key * K

B: sequences in the batch; T: tokens through the model; A: attention pairs (each new token x
the keys it attends to: sum_i n_i * (start_i + (n_i + 1) / 2)); K: keys read (sum_i of each
sequence's context, start_i + n_i: what a memory-bound decode step streams once per sequence).
base carries the weights' read, per_token the matrix work, per_pair and per_key the attention.
Tier copies cost `tier_copy_s_per_page` per page of `page_tokens` tokens. `loop_s` is what the step
loop spends between two steps while work is queued (planning, commands, handing events over):
the simulated loop lets it pass after every step, outside the step's own seconds.

Sources: `calibrate` (agentrt/sim/calibrate.py) fits the CPU model to forward passes measured on
this machine; GPU models are built from published figures (bench/costs/*.json, each naming its
sources)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agentrt.errors import ConfigError
from agentrt.model.batch import SeqChunk

FEATURES = ("base_s", "per_seq_s", "per_token_s", "per_pair_s", "per_key_s")


def features(chunks) -> tuple[float, float, float, float, float]:
    """(1, B, T, A, K) of a batch of SeqChunk (or (start, n) pairs)."""
    b = t = a = k = 0.0
    for c in chunks:
        start, n = (c.start, len(c.tokens)) if isinstance(c, SeqChunk) else c
        b, t = b + 1, t + n
        a += n * (start + (n + 1) / 2)
        k += start + n
    return 1.0, b, t, a, k


@dataclass(frozen=True)
class StepCosts:
    name: str
    base_s: float
    per_seq_s: float
    per_token_s: float
    per_pair_s: float
    per_key_s: float
    tier_copy_s_per_page: float
    page_tokens: int = 16
    loop_s: float = 0.0
    source: str = ""
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in (*FEATURES, "tier_copy_s_per_page", "loop_s"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not v >= 0:
                raise ConfigError(f"StepCosts.{f} must be a number >= 0 (seconds), got {v!r}")

    def seconds(self, chunks) -> float:
        return float(np.dot(self.coefficients, features(chunks)))

    def rel_err(self, samples: list[tuple[list, float]]) -> float:
        """Mean relative error of the model over (chunks, measured seconds) samples."""
        if not samples:
            return 0.0
        return float(np.mean([abs(self.seconds(c) - s) / s for c, s in samples]))

    @property
    def coefficients(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in FEATURES])

    def copy_s(self, pages: int, page_size: int) -> float:
        """Seconds to copy `pages` pages of `page_size` tokens between the pool and the tier."""
        return self.tier_copy_s_per_page * pages * page_size / self.page_tokens

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "StepCosts":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read a cost model from {path}: {e}") from None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def fit(cls, samples: list[tuple[list, float]], *, name: str, tier_copy_s_per_page: float,
            page_tokens: int = 16, loop_s: float = 0.0, source: str = "") -> "StepCosts":
        """Non-negative least squares over (chunks, measured seconds) samples, each weighted by
        1 / seconds (relative error counts: a decode step's 5 ms matters as much as a prefill's
        second)."""
        x = np.array([features(c) for c, _ in samples])
        y = np.array([s for _, s in samples])
        coef = _nnls(x / y[:, None], np.ones_like(y))
        pred = x @ coef
        rel = np.abs(pred - y) / y
        base, per_seq, per_token, per_pair, per_key = (float(c) for c in coef)  # FEATURES' order
        return cls(name, base, per_seq, per_token, per_pair, per_key, tier_copy_s_per_page=tier_copy_s_per_page,
                   page_tokens=page_tokens, loop_s=loop_s, source=source,
                   details={"fit_samples": len(samples), "fit_rel_err_mean": float(rel.mean()),
                            "fit_rel_err_max": float(rel.max())})


def _nnls(a: np.ndarray, b: np.ndarray, tol: float = 1e-10) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson-Hanson active set), columns scaled to unit
    norm first (the features span ten orders of magnitude)."""
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    active, x = np.zeros(n, dtype=bool), np.zeros(n)
    grad = a.T @ (b - a @ x)
    while (~active).any() and grad[~active].max() > tol:
        active[np.argmax(np.where(active, -np.inf, grad))] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if (z[active] > 0).all():
                x = z
                break
            neg = active & (z <= 0)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            active &= x > tol
        grad = a.T @ (b - a @ x)
    return x / scale
