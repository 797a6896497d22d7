"""Token selection on the logits' device: greedy and sampled rows of a step in a few launches and
no host sync (the caller fetches the ids with the rest of the step: engine/device_tail.py).

A sampled row draws by the Gumbel-max trick, argmax(x / T + g) over the tokens its top-k and
top-p keep, which is a draw from softmax(x / T) renormalised over those tokens (the distribution
sampler.adjusted_probs gives). The noise g = -log(-log(u)) is counter-based: u = philox(seed of
the draw, token id) (triton's tl.rand), the draw's seed mixing the request's seed with its output
position (`draw_seed`). So a request's tokens depend on its seed alone, never on its batch-mates,
the batch's order or how many rows the step holds; no generator state lives anywhere.

Top-k, top-p and min-p become one floor per row, in units of x / T: the k-th largest value, the
smallest value top-p keeps (torch.sort on the device, no sync) and the largest value plus
log(min_p); a token is kept when it reaches
the floor, so tokens tied at the floor are all kept (the host sampler breaks such ties by sort
order). The host sampler (sampler.py, a torch.Generator stream) stays the CPU's: the same seed
gives other tokens here than there, and the same tokens here whatever the batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from agentrt.records.params import SamplingParams

_MASK64 = (1 << 64) - 1


def draw_seed(seed: int, index: int) -> int:
    """The seed of a request's draw number `index` (splitmix64 of the pair), as an int64."""
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


@triton.jit
def _gumbel_argmax(x_ptr, stride, seed_ptr, inv_t_ptr, floor_ptr, out_ptr, V, BLOCK: tl.constexpr):
    # one program per row: argmax over the kept tokens of x * inv_t + Gumbel(philox(seed, token))
    row = tl.program_id(0)
    seed = tl.load(seed_ptr + row)
    inv_t = tl.load(inv_t_ptr + row)
    floor = tl.load(floor_ptr + row)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], 0, tl.int64)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row.to(tl.int64) * stride + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        u = tl.maximum(tl.rand(seed, cols), 1e-30)
        xs = x * inv_t
        z = tl.where(xs >= floor, xs - tl.log(-tl.log(u)), float("-inf"))
        better = z > best_v
        best_v = tl.where(better, z, best_v)
        best_i = tl.where(better, cols.to(tl.int64), best_i)
    m = tl.max(best_v, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(best_v == m, best_i, V), axis=0))


def floors(xs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           min_p: torch.Tensor | None = None) -> torch.Tensor:
    """xs [R, V] (logits / T); top_k [R] (V: off), top_p [R] (1.0: off), min_p [R] (0: off) ->
    [R] the smallest kept value of each row (top-k first, then top-p over the renormalised rest,
    then min-p against the likeliest, as adjusted_probs)."""
    v = xs.shape[-1]
    srt = torch.sort(xs, dim=-1, descending=True).values
    kth = srt.gather(1, (top_k - 1).clamp(0, v - 1)[:, None])
    srt_k = srt.masked_fill(torch.arange(v, device=xs.device)[None, :] >= top_k[:, None], float("-inf"))
    p = torch.softmax(srt_k, dim=-1)
    keep = (p.cumsum(-1) - p) < top_p[:, None]  # (the first token always stays)
    last = (keep.sum(-1, keepdim=True) - 1).clamp(min=0)
    floor = torch.maximum(kth, srt.gather(1, last))[:, 0]
    if min_p is not None:  # (p >= min_p * p_max  <=>  x / T >= max + log(min_p); log(0) = -inf)
        floor = torch.maximum(floor, srt[:, 0] + torch.log(min_p))
    return floor


def sample(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None], argmax) -> torch.Tensor:
    """logits [R, V] (masked rows at -inf) -> ids [R] int64 on the logits' device; -1 where a
    row holds a NaN (the caller fails its request). seeds[i]: draw_seed of a sampled row (None
    for a greedy one). argmax: the backend's row-wise argmax."""
    r, v = logits.shape
    ids = argmax(logits).to(torch.int64)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        host = torch.tensor([[1.0 / params[i].temperature, params[i].top_k or v, params[i].top_p, params[i].min_p]
                             for i in sampled], dtype=torch.float64)
        seed_t = torch.tensor([seeds[i] for i in sampled], dtype=torch.int64).to(logits.device, non_blocking=True)
        dev = host.to(logits.device, non_blocking=True)
        idx = torch.tensor(sampled, dtype=torch.int64).to(logits.device, non_blocking=True)
        rows = logits.index_select(0, idx).float()
        inv_t = dev[:, 0].float()
        if any(params[i].top_k or params[i].top_p < 1.0 or params[i].min_p for i in sampled):
            floor = floors(rows * inv_t[:, None], dev[:, 1].long(), dev[:, 2].float(), dev[:, 3].float())
        else:
            floor = torch.full((len(sampled),), float("-inf"), device=logits.device)
        out = torch.empty(len(sampled), dtype=torch.int64, device=logits.device)
        _gumbel_argmax[(len(sampled),)](rows, rows.stride(0), seed_t, inv_t.contiguous(), floor.contiguous(), out, v,
                                        BLOCK=min(1024, triton.next_power_of_2(v)))
        ids = ids.index_copy(0, idx, out)
    return torch.where(torch.isnan(logits).any(-1), -1, ids)


__all__ = ["draw_seed", "floors", "sample"]
