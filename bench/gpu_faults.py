"""Device faults on a real GPU (issue 46; bench/gpu_check.py's `faults` part). What the CPU tests
inject (tests/test_device_faults.py), here for real on the SmolLM2 shape:

  oom       the device's memory filled by another holder, then a 2,048-token prefill: the step's
            requests fail with DeviceOutOfMemory, the engine halves its step size and goes on;
            with the memory given back, the next request runs, nothing leaks (invariants)
  fatal     a device-side assert in the forward (a child process: it poisons the CUDA context):
            the caller gets EngineFailed naming it
  resized   one executor (its CUDA graphs) serving an engine, then a second engine with a pool
            twice the size: the graphs are captured again for the new pool and the tokens agree
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DT = torch.bfloat16


def _model(pack: Path):
    from bench.gpu_shapes import agentrt_model, hf_model

    hf = hf_model(pack, "smol135m", "cuda", DT)
    return agentrt_model(pack, "smol135m", hf, "cuda", DT)


def _fill_device() -> list:
    """Take every byte the device has left (big blocks, then ever smaller ones)."""
    hog, size = [], 1 << 30
    while size >= 1 << 20:
        try:
            hog.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            size //= 4
    return hog


def oom(pack: Path) -> dict:
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams
    from agentrt.errors import DeviceOutOfMemory

    lm = _model(pack)
    sp = SamplingParams(max_tokens=8, ignore_eos=True)
    prompt = [(7 * i) % 40000 + 100 for i in range(2048)]
    out: dict = {}

    async def go():
        async with Engine(lm, EngineConfig(response_cache_size=0, kv_cache_tokens=16384)) as eng:
            before = list((await eng.complete(prompt[:64], sp)).token_ids)
            out["n_batch_before"] = eng.core.cfg.n_batch
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            hog = _fill_device()
            out["hog_gib"] = round(sum(h.numel() for h in hog) / 2**30, 2)
            try:
                await eng.complete(prompt, sp)
                out["full_device_result"] = "completed"  # (the caching allocator had room)
            except DeviceOutOfMemory as e:
                out["full_device_result"] = f"DeviceOutOfMemory: {e}"[:300]
            del hog
            torch.cuda.empty_cache()
            out["n_batch_after"] = eng.core.cfg.n_batch
            out["oom_steps"] = eng.stats().oom_steps
            after = list((await eng.complete(prompt[:64], sp)).token_ids)
            out["next_request_ok"] = True
            out["next_equals_before"] = after == before
            await eng.run_in_step_thread(eng.core.check_invariants)
            st = eng.stats()
            out["pages_free_after"], out["pages_total"] = st.pages_free, st.pages_total

    anyio.run(go)
    out["ok"] = out.get("next_request_ok", False) and out["full_device_result"].startswith("DeviceOutOfMemory")
    return out


def fatal_child(pack: str) -> None:
    """(In the child.) An executor whose forward trips a device-side assert."""
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams
    from agentrt.engine.executor import ModelExecutor
    from agentrt.errors import EngineFailed

    lm = _model(Path(pack))

    class Tripping(ModelExecutor):
        def run(self, plan, chunks, store, page_size):
            x = torch.zeros(4, device="cuda")
            x[torch.tensor([1 << 20], device="cuda")] = 1.0  # out of bounds: a device-side assert
            torch.cuda.synchronize()
            return super().run(plan, chunks, store, page_size)

    async def go():
        async with Engine(lm, EngineConfig(response_cache_size=0), executor=Tripping(lm.model)) as eng:
            try:
                await eng.complete([100, 200, 300], SamplingParams(max_tokens=2))
                return {"result": "completed"}
            except EngineFailed as e:
                return {"result": f"EngineFailed: {e}"[:400], "typed": True}

    print("RESULT", json.dumps(anyio.run(go)), flush=True)


def fatal(pack: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "bench.gpu_faults", "fatal-child", str(pack)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    res = json.loads(line[7:]) if line else {"result": None, "stderr": r.stderr[-600:]}
    res["rc"] = r.returncode
    res["ok"] = bool(res.get("typed")) and ("device-side assert" in res["result"] or "CUDA" in res["result"])
    return res


def resized(pack: Path) -> dict:
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams
    from agentrt.engine.executor import ModelExecutor

    lm = _model(pack)
    ex = ModelExecutor(lm.model)
    sp = SamplingParams(max_tokens=24, ignore_eos=True)
    prompt = [(11 * i) % 40000 + 100 for i in range(300)]
    outs, stores = [], []

    async def go(kv: int):
        async with Engine(lm, EngineConfig(response_cache_size=0, kv_cache_tokens=kv), executor=ex) as eng:
            outs.append(list((await eng.complete(prompt, sp)).token_ids))
            stores.append(ex.graphs.key(ex.graphs.store) if ex.graphs is not None else None)

    anyio.run(go, 8192)
    anyio.run(go, 16384)
    return {"tokens_equal": outs[0] == outs[1], "graph_steps": ex.steps["graph"], "eager_steps": ex.steps["eager"],
            "graphs_recaptured_for_new_pool": stores[0] != stores[1],
            "ok": outs[0] == outs[1] and ex.steps["graph"] > 0 and stores[0] != stores[1]}


def faults(pack: Path) -> dict:
    res = {}
    for name, fn in (("oom", oom), ("fatal", fatal), ("resized", resized)):
        try:
            res[name] = fn(pack)
        except Exception as e:  # noqa: BLE001 - each fault case reports on its own
            res[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["fatal-child"]:
        fatal_child(sys.argv[2])
    else:
        print(json.dumps(faults(Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / ".gpu" / "pack")), indent=1))
