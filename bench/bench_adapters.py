"""LoRA adapters on the embedded SmolLM2-135M (its GGUF's own quantization, the fused kernels),
one run, side by side (issue 58). Adapters are random rank-16 LoRAs over all seven projections,
written as PEFT directories here (the base has no transformers checkpoint to train one on).

  mixed_decode_over_base   a decode step of 8 rows on 8 adapters / the same 8 rows on the base
                           (the model's forward alone, median of repeated steps); the adapters
                           saved in bf16 and kept so (their own precision); `_fp32`: saved in fp32
  mixed_vs_llamacpp_per_adapter
                           4 agents x 6 tool-calling turns (bench/workloads' synthetic scripts,
                           force-decoded) on 4 adapters, end to end: llama-cpp-python with one
                           Llama per adapter (its LoRA as a GGUF file written from the same PEFT
                           directory) / agentrt with all four in one engine
  alora_prompt_tokens_computed_fraction
                           a checker turn (an aLoRA) on a session after the base model's turn over
                           a ~2,000-token conversation: prompt tokens computed / prompt tokens;
                           the same weights as a plain LoRA beside it (1.0: it recomputes all)
  alora_ttft_over_lora     that turn's time to first token, aLoRA / plain LoRA
  adapter_memory_over_files  bytes the 8 loaded adapters hold / bytes of their files

Writes bench/results/adapters.json.   python -m bench.bench_adapters [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import torch

from agentrt import Engine, EngineConfig, SamplingParams, load_model
from agentrt.adapters import LoraStep
from agentrt.adapters.gguf_files import write_gguf_lora
from agentrt.adapters.lora import TARGETS, target_shapes
from agentrt.adapters.registry import read_adapter
from agentrt.conversation.chat_format import ChatFormat
from agentrt.kv.store import KVStore
from agentrt.model.batch import SeqChunk, build_batch
from bench.common import machine, print_table, write_results
from bench.peers.agentrt_peer import forced_call
from bench.peers.base import NotRun, drive
from bench.peers.llamacpp_peer import LlamaCppSystem, ensure_llama_cpp
from bench.workloads.synthetic_agents import SyntheticSpec, synthetic_scripts

INVOCATION = [28, 15471, 29]  # any tokens; the checker's turn ends with them


def write_adapter(root: Path, cfg, seed: int, rank: int = 16, alora: list[int] | None = None,
                  scale: float = 0.02, dtype: torch.dtype = torch.float32) -> Path:
    """A random PEFT LoRA directory for a model of config `cfg` (all seven projections)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg.num_layers):
        for target, (n_in, n_out, _) in target_shapes(cfg).items():
            part = "self_attn" if TARGETS[target][0] in ("qkv", "o") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{target}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(rank, n_in, generator=g) * scale).to(dtype)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(n_out, rank, generator=g) * scale).to(dtype)
    root.mkdir(parents=True, exist_ok=True)
    save_file(tensors, root / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS),
              "alora_invocation_tokens": alora, "task_type": "CAUSAL_LM"}
    (root / "adapter_config.json").write_text(json.dumps(config))
    return root


def decode_step_ratio(lm, adapters, repeat: int) -> tuple[float, float]:
    """Median seconds of one 8-row decode step on the base and on 8 adapters (same rows)."""
    model, ps, ctx = lm.model, 16, 256
    kv = KVStore.allocate(model.cfg, 8 * (ctx // ps + 1), ps, model.kv_dtype)
    pages = [list(range(i * (ctx // ps + 1), (i + 1) * (ctx // ps + 1))) for i in range(8)]
    prompts = [torch.randint(100, 40000, (ctx,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(8)]
    fb = build_batch([SeqChunk(p, 0, pg, 1) for p, pg in zip(prompts, pages)], ps)
    model(fb.input_ids, fb.positions, kv, fb.meta, fb.logits_rows)  # (the prompts' KV)

    def step(with_adapters: bool) -> float:
        chunks = [SeqChunk([7], ctx, pg, 1, adapter=a if with_adapters else None) for pg, a in zip(pages, adapters)]
        b = build_batch(chunks, ps)
        lora = LoraStep.of(chunks)
        t0 = time.perf_counter()
        model(b.input_ids, b.positions, kv, b.meta, b.logits_rows, **({"lora": lora} if lora else {}))
        return time.perf_counter() - t0
    times = {False: [], True: []}
    for i in range(repeat + 2):  # alternating, the first two of each dropped (warm-up)
        for mode in (False, True):
            dt = step(mode)
            if i >= 2:
                times[mode].append(dt)
    return statistics.median(times[False]), statistics.median(times[True])


async def checker_turns(lm, dirs, history_tokens: int) -> dict:
    """A base turn over a long conversation on a session, then the checker turn as an aLoRA and
    as a plain LoRA of the same weights (each on a fork of the session after the base turn)."""
    g = torch.Generator().manual_seed(3)
    history = torch.randint(100, 40000, (history_tokens,), generator=g).tolist()
    check = history + INVOCATION
    out = {}
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384, response_cache_size=0)) as engine:
        await engine.load_adapter("checker", dirs["alora"])
        await engine.load_adapter("checker-lora", dirs["lora"])
        async with await engine.open_session() as s:
            await engine.complete(history, SamplingParams(max_tokens=1), session=s)
            for name in ("checker", "checker-lora"):
                async with await s.fork() as f:
                    c = await engine.complete(check, SamplingParams(max_tokens=8, ignore_eos=True), session=f,
                                              adapter=name)
                    out[name] = c.usage
    return out


AGENTS = {True: SyntheticSpec(agents=4, turns=6, anchor_tokens=300, user_tokens=40, result_tokens=(30, 60),
                              n_tools=2, max_args=2, shared_system=False),
          False: SyntheticSpec(agents=4, turns=6, shared_system=False)}


async def agentrt_agents(lm, scripts, names: list[str], dirs: list[Path]) -> tuple[float, bool]:
    """(wall seconds, every output as scripted) of the scripts on one engine, agent i on adapter i."""
    async with Engine(lm, EngineConfig(response_cache_size=0)) as eng:
        for n, d in zip(names, dirs):
            await eng.load_adapter(n, d)
        await eng.complete(list(range(100, 164)), SamplingParams(max_tokens=4, ignore_eos=True))  # (warm-up)
        sess = {s[0].agent: await eng.open_session(adapter=names[s[0].agent]) for s in scripts}
        records, wall = await drive(scripts, "concurrent", lambda c: forced_call(eng, c, sess[c.agent]))
        for s in sess.values():
            await s.close()
    return wall, all(r.exact for r in records)


def agents_vs_llamacpp(lm, root: Path, quick: bool) -> dict:
    """4 agents x 6 turns on 4 adapters: agentrt (one engine) and llama.cpp (one Llama each)."""
    cfg = lm.model.cfg
    scripts = synthetic_scripts(ChatFormat(lm.tokenizer), lm.tokenizer, AGENTS[quick])
    names = [f"agent{i}" for i in range(4)]
    dirs = [write_adapter(root / n, cfg, seed=100 + i) for i, n in enumerate(names)]
    ours, exact = anyio.run(agentrt_agents, lm, scripts, names, dirs)
    out = {"agents_agentrt_wall_s": ours, "agents_agentrt_exact": exact, "agents_llamacpp_wall_s": None}
    ensure_llama_cpp(True)
    loras = [str(write_gguf_lora(d, cfg, root / f"{n}.gguf")) for n, d in zip(names, dirs)]
    peer = LlamaCppSystem.per_adapter_system(lm.source, loras)
    if isinstance(peer, NotRun):
        return {**out, "llamacpp_not_run": peer.reason}
    anyio.run(peer.warmup)
    res = anyio.run(peer.run, scripts, "concurrent")
    peer.close()
    return {**out, "agents_llamacpp_wall_s": res.wall_s, "agents_llamacpp_exact": all(r.exact for r in res.records),
            "mixed_vs_llamacpp_per_adapter": res.wall_s / ours}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, smaller agents (minutes)")
    args = ap.parse_args()
    lm = load_model("smollm2-135m")
    cfg = lm.model.cfg
    repeat = 10 if args.quick else 40
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = [write_adapter(root / f"a{i}", cfg, seed=i) for i in range(8)]
        bf16 = [write_adapter(root / f"b{i}", cfg, seed=i, dtype=torch.bfloat16) for i in range(8)]
        special = {"alora": write_adapter(root / "alora", cfg, 50, alora=INVOCATION),
                   "lora": write_adapter(root / "lora", cfg, 50)}
        adapters = [read_adapter(f"a{i}", d, lm.model) for i, d in enumerate(dirs)]
        file_bytes = sum((d / "adapter_model.safetensors").stat().st_size for d in dirs)
        base_s, mixed_s = decode_step_ratio(lm, [read_adapter(f"b{i}", d, lm.model) for i, d in enumerate(bf16)],
                                            repeat)
        base32_s, mixed32_s = decode_step_ratio(lm, adapters, repeat)
        turns = anyio.run(checker_turns, lm, special, 2000)
        agents = agents_vs_llamacpp(lm, root, args.quick)
    al, lo = turns["checker"], turns["checker-lora"]
    result = {
        "machine": machine(),
        "model": "smollm2-135m (GGUF Q4_1 / Q8_0, fused kernels)",
        "rank": 16, "targets": list(TARGETS),
        "decode_step_base_ms": base_s * 1e3, "decode_step_mixed_ms": mixed_s * 1e3,
        "mixed_decode_over_base": mixed_s / base_s, "mixed_adapter_dtype": "bfloat16",
        "mixed_decode_over_base_fp32": mixed32_s / base32_s,
        "alora_prompt_tokens_computed_fraction": al.computed_prompt_tokens / al.prompt_tokens,
        "lora_prompt_tokens_computed_fraction": lo.computed_prompt_tokens / lo.prompt_tokens,
        "alora_ttft_s": al.prefill_s, "lora_ttft_s": lo.prefill_s,
        "alora_ttft_over_lora": al.prefill_s / lo.prefill_s,
        "adapter_memory_over_files": sum(a.nbytes for a in adapters) / file_bytes,
        "mixed_vs_llamacpp_per_adapter": None, **agents,
        "agents_workload": {"agents": 4, "turns": 6, "quick": args.quick},
        "quick": args.quick,
    }
    print_table("LoRA adapters (smollm2-135m)", ["figure", "value"],
                [[k, f"{v:.3f}" if isinstance(v, float) else v] for k, v in result.items()
                 if k not in ("machine", "targets")])
    write_results("adapters", result)


if __name__ == "__main__":
    main()
