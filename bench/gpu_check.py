"""GPU readiness, in one JSON (bench/gpu_check.sh runs it; about 5 minutes on one GPU).

Three parts, each reported on its own (`ok`, its figures, or the error that stopped it):
  1. the triton kernel tests, natively (tests/test_kernels.py: each kernel against its torch
     reference, and a model step on the triton backend);
  2. the embedded model's forward on the device: decode steps of 1 and 8 sequences at contexts
     128 and 2048 (bench/context_case.py's step timing), fp32 weights;
  3. a 4-agent tool-calling turn loop through the Engine on the device (bench/ff_case.py's
     agents8 workload cut to 4 agents, fast-forward on).
On a machine without CUDA, part 1 runs in triton's interpreter and parts 2-3 say so.

    python -m bench.gpu_check [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def part(fn):
    """fn() -> dict, timed; an exception becomes the part's error."""
    t0 = time.perf_counter()
    try:
        out = {"ok": True, **fn()}
    except Exception as exc:  # reported, never raised: the JSON says what is not ready
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def kernel_tests() -> dict:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_kernels.py"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    tail = (r.stdout + r.stderr).strip().splitlines()[-1:] or [""]
    if r.returncode != 0:
        raise RuntimeError(tail[0])
    return {"summary": tail[0]}


def forward(device: str) -> dict:
    import torch

    from agentrt import load_model
    from bench.context_case import step_ms

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    lm = load_model("smollm2-135m", quantize="none", device=device)
    return {f"decode_b{b}_ms_ctx{c}": step_ms(lm.model, c, b, 2, 8) for c in (128, 2048) for b in (1, 8)}


def turn_loop(device: str) -> dict:
    import anyio
    import torch

    from agentrt import EngineConfig, load_model
    from agentrt.conversation.chat import ChatFormat
    from bench.agents_cases import QUICK, build_cases, kv_tokens
    from bench.ff_case import prepare, run_scripts, summary

    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    lm = load_model("smollm2-135m", device=device)
    fmt = ChatFormat(lm.tokenizer)
    case = next(c for c in build_cases(fmt, lm.tokenizer, quick=True) if c.key == "agents8")
    scripts = case.make(0)[:4]
    assert QUICK["agents8"].agents >= 4
    cfg = EngineConfig(response_cache_size=0, kv_cache_tokens=kv_tokens(scripts, None))

    async def go():
        factory = await prepare(lm, cfg, scripts, None)
        return await run_scripts(lm, cfg, scripts, case.arrival, factory)
    t0 = time.perf_counter()
    recs = anyio.run(go)
    return {**summary(recs), "wall_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    from bench.common import machine

    res = {"machine": machine(), "device": args.device}
    try:
        import torch

        res["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as exc:
        res["cuda"] = f"error: {exc}"
    res["triton_kernel_tests"] = part(kernel_tests)
    res["forward"] = part(lambda: forward(args.device))
    res["agents4_turn_loop"] = part(lambda: turn_loop(args.device))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
