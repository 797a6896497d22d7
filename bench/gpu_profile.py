"""Where a GPU step's time goes (run beside bench/gpu_check.py on the same host):

  * the host: cProfile of 50 decode steps through ModelExecutor.run (1B shape, batch 1)
  * the device: torch.profiler kernel tables of a graph replay (1B and 8B bf16, 1B in the
    batch-invariant mode, 8B over Q4_K planes; batch 1), an eager decode step and an eager
    prefill of 2,048 tokens (1B)
  * the agents8 cut: steps by kind (graph / eager) with their wall time

    python -m bench.gpu_profile --pack .gpu/pack      (writes $OUT/gpu_profile.txt)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from agentrt.engine.executor import ModelExecutor
from agentrt.model.batch import SeqChunk

DT = torch.bfloat16


def kernel_table(fn, n=3, rows=18) -> str:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=60)


def setup(lm, ctx=1024, batch=1):
    ex = ModelExecutor(lm.model)
    per = -(-(ctx + 200) // 16)
    store = ex.allocate(per * batch + 2, 16)
    pages = [list(range(b * per, (b + 1) * per)) for b in range(batch)]
    ids = torch.randint(100, 40000, (ctx,)).tolist()
    for b in range(batch):
        ex.run([], [SeqChunk(ids, 0, pages[b])], store, 16)
    return ex, store, pages


def host_profile(ex, store, pages, ctx=1024) -> str:
    def step(i):  # (the logits stay on the device: wait for the step, as the engine's fetch does)
        ex.run([], [SeqChunk([200], ctx + i, pages[0])], store, 16)
        torch.cuda.current_stream().synchronize()
    step(0)
    pr = cProfile.Profile()
    t0 = time.perf_counter()
    pr.enable()
    for i in range(1, 51):
        step(i)
    pr.disable()
    wall = (time.perf_counter() - t0) / 50 * 1e3
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(22)
    return f"decode step b1 through run(): {wall:.3f} ms\n" + s.getvalue()


def one_model(lm, name: str, out: list, prefill: bool) -> None:
    ex, store, pages = setup(lm)
    out.append(f"==== {name}: host\n" + host_profile(ex, store, pages))
    g, _ = ex.graphs.graphs[1]
    out.append(f"==== {name}: graph replay b1\n" + kernel_table(g.replay))
    eager = ModelExecutor(lm.model, cuda_graphs=False)
    out.append(f"==== {name}: eager decode b1\n" + kernel_table(
        lambda: eager.run([], [SeqChunk([200], 1100, pages[0])], store, 16), n=2))
    if prefill:
        ids = torch.randint(100, 40000, (2048,)).tolist()
        st2 = eager.allocate(130, 16)
        out.append(f"==== {name}: eager prefill 2048\n" + kernel_table(
            lambda: eager.run([], [SeqChunk(ids, 0, list(range(128)))], st2, 16), n=2, rows=25))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pack", default=".gpu/pack")
    ap.add_argument("--shapes", default="llama1b,llama1b_invariant,llama8b_q4k,llama8b")
    args = ap.parse_args()
    from agentrt.model import device_quant
    from bench.gpu_shapes import random_agentrt_model, random_q4k_model

    def build(name: str):
        if name == "llama8b_q4k":
            return random_q4k_model(Path(args.pack), "llama8b", "cuda", DT, invariant=True)
        lm = random_agentrt_model(Path(args.pack), name.removesuffix("_invariant"), "cuda", DT)
        device_quant.place(lm.model, name.endswith("_invariant"))
        return lm

    out: list[str] = []
    dest = Path(os.environ.get("OUT", "/tmp")) / "gpu_profile.txt"
    for shape in args.shapes.split(","):
        lm = build(shape)
        one_model(lm, shape, out, prefill=shape.startswith("llama1b"))
        dest.write_text("\n\n".join(out))
        del lm
        torch.cuda.empty_cache()
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
