"""The engine on a GPU, in one JSON (bench/gpu_check.sh runs it on an offline host; ~6 minutes).

Parts, each reported on its own (`ok`, its figures, or the error that stopped it):
  kernels   tests/test_kernels.py and tests/test_device_placement.py, natively
  llama1b   the 1B-like shape (bf16, random weights shared with transformers): logits against
            transformers; a decode step eager and as a CUDA graph (batch 1/8/32, 1,024-token
            context); prefill of 2,048 tokens; per token through Engine.generate over the graph
            step; greedy tokens alone (generate(), eager) = batched = after a radix hit
            (Engine); transformers eager per token on the same weights
            the same weights in the batch-invariant mode (load_model's default): its logits, steps,
            prefill, cost over the default, and greedy alone = batched = after a radix hit
  llama8b   the Llama-3-8B shape, decode step at batch 1 (graph) and eager, weight bytes
  llama8b_q4k  the 8B shape over packed Q4_K planes (kernels/triton_quant.py): weight bytes on the
            device, decode steps at batch 1 and 8, a 512-token prefill
  faults    bench/gpu_faults.py: a real out-of-memory in a step (DeviceOutOfMemory, smaller steps,
            the engine goes on), a device-side assert (EngineFailed naming it), a second pool
            under the same executor's CUDA graphs (captured again, the same tokens)
  agents    bench_agents' agents8 scripts (forced tokens: tool calls, results, fast-forward) on
            the SmolLM2 shape through agentrt and through transformers eager (the same cut of
            scripts), end to end

    python -m bench.gpu_check --pack .gpu/pack [--out bench/results/gpu.json] [--parts ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from bench.gpu_faults import faults

ROOT = Path(__file__).resolve().parents[1]
DT = torch.bfloat16


def part(res: dict, name: str, fn, limit_s: int, out: Path) -> None:
    def alarm(*_):
        raise TimeoutError(f"part over {limit_s} s")
    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    t0 = time.perf_counter()
    try:
        res[name] = {"ok": True, **fn()}
    except Exception as exc:  # reported, never raised: the JSON says what did not run
        res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800], "tb": traceback.format_exc()[-2000:]}
    finally:
        signal.alarm(0)
    res[name]["seconds"] = round(time.perf_counter() - t0, 1)
    print(name, json.dumps(res[name])[:1500], flush=True)
    out.write_text(json.dumps(res, indent=1))
    torch.cuda.empty_cache()


def kernel_tests() -> dict:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernels.py",
                        "tests/test_device_placement.py", "tests/test_cuda_graphs.py", "tests/test_triton_quant.py",
                        "tests/test_gpu_invariance.py"], cwd=ROOT, capture_output=True, text=True,
                       timeout=100)
    lines = (r.stdout + r.stderr).strip().splitlines()
    return {"rc": r.returncode, "summary": lines[-1:], "failures": [x for x in lines if "FAILED" in x][:10],
            "tail": lines[-40:] if r.returncode else []}


def timed(fn, n: int) -> float:
    """Median ms of fn() over n calls, synchronized."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return round(1e3 * statistics.median(times), 3)


def decode_steps(lm, batches=(1, 8, 32), ctx=1024, steps=20) -> dict:
    """ms of one decode step through ModelExecutor.run (host build + copy + forward; the logits
    stay on the device, as the engine's device tail reads them), synchronized: eager and as a
    CUDA graph replay; and the bare replay."""
    from agentrt.engine.executor import ModelExecutor
    from agentrt.model.batch import SeqChunk

    ps, per = 16, -(-(ctx + 4 * steps + 8) // 16)
    out = {}
    for graphs in (False, True):
        ex = ModelExecutor(lm.model, cuda_graphs=graphs)
        store = ex.allocate(per * max(batches), ps)
        pages = [list(range(b * per, (b + 1) * per)) for b in range(max(batches))]
        ids = torch.randint(100, 40000, (ctx,)).tolist()
        for b in range(max(batches)):  # every sequence's KV at `ctx` (the same ids: speed only)
            ex.run([], [SeqChunk(ids, 0, pages[b])], store, ps)
        for b in batches:
            pos = [ctx]

            def step():
                ex.run([], [SeqChunk([200], pos[0], pages[i]) for i in range(b)], store, ps)
                pos[0] += 1
            step()  # (captures the bucket)
            out[f"decode_b{b}_{'graph' if graphs else 'eager'}_ms"] = timed(step, steps)
            pos[0] = ctx
        if graphs:
            g, _ = ex.graphs.graphs[1]
            out["replay_b1_ms"] = timed(g.replay, steps)
            g, _ = ex.graphs.graphs[max(batches)]
            out[f"replay_b{max(batches)}_ms"] = timed(g.replay, steps)
    return out


def prefill(lm, n=2048) -> dict:
    from agentrt.engine.executor import ModelExecutor
    from agentrt.model.batch import SeqChunk

    ex = ModelExecutor(lm.model)
    store = ex.allocate(n // 16 + 1, 16)
    ids = torch.randint(100, 40000, (n,)).tolist()
    ms = timed(lambda: ex.run([], [SeqChunk(ids, 0, list(range(n // 16)))], store, 16), 5)
    return {f"prefill_{n}_ms": ms, f"prefill_{n}_tok_per_s": round(n / ms * 1e3)}


def logits_vs_hf(lm, hf) -> dict:
    from agentrt.model.generate import prompt_logits

    prompt = torch.randint(100, 40000, (300,)).tolist()
    ours = prompt_logits(lm.model, prompt).float().cpu()
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt], device="cuda")).logits[0].float().cpu()
    return {"logits_max_abs_diff": round(float((ours - ref).abs().max()), 4),
            "logits_ref_max_abs": round(float(ref.abs().max()), 4),
            "argmax_agree": round(float((ours.argmax(-1) == ref.argmax(-1)).float().mean()), 4)}


def engine_generate(lm, graph_step_ms: float, new=128) -> dict:
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams

    prompt = torch.randint(100, 40000, (256,)).tolist()
    sp = SamplingParams(max_tokens=new, ignore_eos=True)

    async def go():
        async with Engine(lm, EngineConfig(response_cache_size=0)) as eng:
            await eng.complete(prompt[:40], SamplingParams(max_tokens=8, ignore_eos=True))
            stamps = []
            async for ev in eng.generate(prompt, sp):
                stamps.extend([time.perf_counter()] * len(ev.token_ids))
            return stamps
    stamps = anyio.run(go)
    per = 1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    return {"engine_generate_b1_ms_per_token": round(per, 3),
            "engine_generate_over_graph_step": round(per / graph_step_ms, 3)}


def _busy_fraction(prof) -> tuple[float, int]:
    """(share of the span from the first kernel's start to the last one's end in which some
    kernel ran, kernels) of a torch profile."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not spans:
        return 0.0, 0
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo = busy + hi - lo, a
        hi = max(hi, b)
    busy += hi - lo
    return busy / (spans[-1][1] - spans[0][0]) if spans[-1][1] > spans[0][0] else 1.0, len(spans)


def step_tail(lm, agents: int = 8, new: int = 48) -> dict:
    """Through the Engine (the device tail, graphs), `agents` concurrent requests: the host's
    waits for the device per step (StepFetch's explicit waits plus the implicit syncs torch's
    sync debug mode reports) and the share of the run the GPU sat idle between kernels."""
    import warnings

    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams

    prompts = [torch.randint(100, 40000, (200 + 13 * i,)).tolist() for i in range(agents)]
    sp = SamplingParams(max_tokens=new, ignore_eos=True)

    async def go(eng):
        async with anyio.create_task_group() as tg:
            for p in prompts:
                tg.start_soon(eng.complete, p, sp)

    async def run():
        async with Engine(lm, EngineConfig(response_cache_size=0)) as eng:
            await eng.complete(prompts[0][:40], SamplingParams(max_tokens=8, ignore_eos=True))  # (warm-up)
            c = eng.core.counters
            steps0, syncs0 = c.steps, c.host_syncs
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                        await go(eng)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            steps = c.steps - steps0
            implicit = sum("synchroniz" in str(w.message) for w in caught)
            return steps, c.host_syncs - syncs0, implicit, prof
    steps, explicit, implicit, prof = anyio.run(run)
    busy, kernels = _busy_fraction(prof)
    return {"tail_steps": steps, "host_syncs_per_step": round((explicit + implicit) / max(steps, 1), 3),
            "host_waits_explicit": explicit, "implicit_syncs": implicit,
            "gpu_idle_between_steps_fraction": round(1 - busy, 4), "tail_kernels": kernels}


def greedy_identity(lm) -> dict:
    """Greedy ids: alone (the naive oracle, eager) vs batched with others vs after a radix hit."""
    import anyio

    from agentrt import Engine, EngineConfig, SamplingParams
    from agentrt.model.generate import generate

    head = torch.randint(100, 40000, (64,)).tolist()
    prompts = [head + torch.randint(100, 40000, (20 + 9 * i,)).tolist() for i in range(8)]
    sp = SamplingParams(max_tokens=32, ignore_eos=True)
    alone = [generate(lm.model, p, sp) for p in prompts]

    async def go():
        async with Engine(lm, EngineConfig(response_cache_size=0)) as eng:
            outs = [None] * len(prompts)

            async def one(i):
                outs[i] = list((await eng.complete(prompts[i], sp)).token_ids)
            async with anyio.create_task_group() as tg:
                for i in range(len(prompts)):
                    tg.start_soon(one, i)
            again = [list((await eng.complete(p, sp)).token_ids) for p in prompts[:4]]  # radix hits
            return outs, again
    batched, again = anyio.run(go)
    first = [next((k for k, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(batched, alone)]
    return {"batched_equal_alone": sum(x == y for x, y in zip(batched, alone)), "of": len(prompts),
            "radix_hit_equal_alone": sum(x == y for x, y in zip(again, alone)), "radix_of": len(again),
            "first_difference": first}


def hf_per_token(hf, batch=1, new=32) -> dict:
    ids = torch.randint(100, 40000, (batch, 256), device="cuda")
    hf.generation_config.pad_token_id = 0
    with torch.inference_mode():
        hf.generate(ids[:, :32], max_new_tokens=4, min_new_tokens=4, do_sample=False)
        one = timed(lambda: hf.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False), 2)
        full = timed(lambda: hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False), 1)
    return {f"hf_generate_b{batch}_ms_per_token": round((full - one) / (new - 1), 3)}


def llama1b(pack: Path) -> dict:
    """The default mode (cuBLAS, SDPA by shape) and the batch-invariant one (load_model's
    default: fixed-tile triton GEMMs, a fixed attention split) on the same weights; the issue's
    `batched_equal_alone` / `radix_hit_equal_alone` are the invariant mode's."""
    from bench.gpu_shapes import agentrt_model, hf_model

    hf = hf_model(pack, "llama1b", "cuda", DT)
    lm = agentrt_model(pack, "llama1b", hf, "cuda", DT)
    res = {"kernels": lm.model.ops.name}
    res.update(logits_vs_hf(lm, hf))
    res.update(decode_steps(lm))
    res.update(prefill(lm))
    res.update(engine_generate(lm, res["decode_b1_graph_ms"]))
    res.update({f"default_{k}": v for k, v in greedy_identity(lm).items()})
    res.update(hf_per_token(hf))
    del lm
    torch.cuda.empty_cache()
    inv = agentrt_model(pack, "llama1b", hf, "cuda", DT, invariant=True)
    res.update({f"invariant_{k}": v for k, v in logits_vs_hf(inv, hf).items()})
    steps = decode_steps(inv, batches=(1, 32), steps=10)
    res.update({f"invariant_{k}": v for k, v in steps.items() if k.endswith("graph_ms")})
    res["invariant_step_cost_over_default"] = {
        f"b{b}": round(steps[f"decode_b{b}_graph_ms"] / res[f"decode_b{b}_graph_ms"], 3) for b in (1, 32)}
    res.update({f"invariant_{k}": v for k, v in prefill(inv).items()})
    res.update(greedy_identity(inv))
    res.update(step_tail(inv))
    return res


def llama8b(pack: Path) -> dict:
    from agentrt.model.device_quant import weight_bytes
    from bench.gpu_shapes import random_agentrt_model

    lm = random_agentrt_model(pack, "llama8b", "cuda", DT)
    return {**decode_steps(lm, batches=(1,), steps=10), "weight_bytes_on_device": weight_bytes(lm.model)}


def llama8b_q4k(pack: Path) -> dict:
    """The 8B shape over packed Q4_K planes (a Q6_K head): the GGUF a desktop user runs."""
    from agentrt.model.device_quant import weight_bytes
    from bench.gpu_shapes import random_q4k_model

    lm = random_q4k_model(pack, "llama8b", "cuda", DT, invariant=True)
    res = {"weight_bytes_on_device": weight_bytes(lm.model),
           "memory_allocated_bytes": torch.cuda.memory_allocated()}
    res.update(decode_steps(lm, batches=(1, 8), steps=10))
    res.update(prefill(lm, 512))
    return res


def agents(pack: Path, agents: int, turns: int) -> dict:
    import anyio

    from agentrt import EngineConfig
    from agentrt.conversation.chat_format import ChatFormat
    from bench.cases.agents_cases import build_cases, kv_tokens
    from bench.gpu_shapes import agentrt_model, hf_model
    from bench.peers.agentrt_peer import AgentrtSystem
    from bench.peers.hf_peer import TransformersSystem

    hf = hf_model(pack, "smol135m", "cuda", DT)
    lm = agentrt_model(pack, "smol135m", hf, "cuda", DT, invariant=True)  # (load_model's default)
    case = next(c for c in build_cases(ChatFormat(lm.tokenizer), lm.tokenizer, quick=True) if c.key == "agents8")
    scripts = [s[:turns] for s in case.make(0)[:agents]]
    cfg = EngineConfig(response_cache_size=0, kv_cache_tokens=kv_tokens(scripts, None))
    out = {"agents": len(scripts), "turns": turns, "calls": sum(map(len, scripts)),
           "output_tokens": sum(len(c.output) for s in scripts for c in s)}
    from agentrt.engine.executor import ModelExecutor

    ex = ModelExecutor(lm.model)
    for name, system in (("agentrt", AgentrtSystem.full(lm, cfg)), ("transformers", TransformersSystem(hf))):
        async def go():
            await system.warmup()
            return await (system.run(scripts, case.arrival, executor=ex) if name == "agentrt"
                          else system.run(scripts, case.arrival))
        r = anyio.run(go)
        out[f"{name}_wall_s"] = round(r.wall_s, 3)
        out[f"{name}_outputs_as_scripted"] = sum(bool(c.exact) for c in r.records)
    out["agentrt_steps"] = dict(ex.steps)
    out["agentrt_replayed_fraction"] = round(ex.steps["graph"] / max(1, sum(ex.steps.values())), 3)
    out["agentrt_step_seconds"] = {k: round(v, 3) for k, v in ex.seconds.items()}
    out["agentrt_speedup_over_transformers"] = round(out["transformers_wall_s"] / out["agentrt_wall_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pack", default=str(ROOT / ".gpu" / "pack"))
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", str(ROOT / "bench" / "results")), "gpu.json"))
    ap.add_argument("--parts", default="kernels,llama1b,llama8b_q4k,llama8b,agents,faults")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2)
    args = ap.parse_args()
    pack, out, parts = Path(args.pack), Path(args.out), args.parts.split(",")
    out.parent.mkdir(parents=True, exist_ok=True)
    import platform

    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    res = {"machine": machine, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "command": "bash bench/gpu_check.sh"}
    try:
        import triton
        res["triton"] = triton.__version__
    except ImportError:
        res["triton"] = None
    plan = {"kernels": (kernel_tests, 110), "llama1b": (lambda: llama1b(pack), 240),
            "llama8b": (lambda: llama8b(pack), 90), "llama8b_q4k": (lambda: llama8b_q4k(pack), 90),
            "agents": (lambda: agents(pack, args.agents, args.turns), 120),
            "faults": (lambda: faults(pack), 180)}
    for name in parts:
        part(res, name, plan[name][0], plan[name][1], out)


if __name__ == "__main__":
    main()
