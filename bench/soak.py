"""Soak (issues 13, 30): many agents over few session ids and a small KV pool, with tool
faults, timeouts and cancellations.

64 agents x 20 turns (`--quick`: 64 x 4) on a tiny random model with SmolLM2's tokenizer, over
16 session ids (`--session-ids`): idle agents are passivated (session closed, KV to the prefix
cache / tier) and activated on their next turn (runtime/leases.py), while the KV pool holds
about 16 agents' histories, so idle sessions are also detached and recomputed under pressure.
Tools fail at random (exceptions, timeouts, sys.exit), and asks are cancelled at random. Afterwards:
  * 0 leaked pages or sequence ids (pool, radix and page invariants checked);
  * 0 asks that ended in PoolExhausted (`pool_exhausted`: session ids are handed out in arrival
    order, so a burst of agents onto the ids never starves one past `acquire_timeout`);
  * every agent's next greedy output, on its re-activated session, equals naive decoding of its
    history (the oracle `agentrt.model.generate.generate`);
  * RSS growth over the run is reported.
Writes bench/results/soak.json.

    python -m bench.soak [--quick] [--agents N] [--turns N] [--session-ids N]
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Literal

import anyio

from agentrt import Agent, Engine, EngineConfig, LoadedModel, Runtime, SamplingParams, tool  # noqa: E402
from agentrt.conversation.engine_text import chat_format_of  # noqa: E402
from agentrt.errors import AgentrtError, AskTimeout, PoolExhausted, RequestCancelled  # noqa: E402
from agentrt.model.generate import generate  # noqa: E402
from bench.common import RESULTS, machine  # noqa: E402


@tool(timeout=0.05, retries=1)
async def lookup(key: Literal["alpha", "beta", "gamma"]) -> str:
    """Look a key up (gamma times out)."""
    if key == "gamma":
        await anyio.sleep(1.0)
    return f"value-{key}"


@tool
def flaky(fail: bool) -> str:
    """Succeed or raise (or exit, as argparse does: contained as a tool error)."""
    if fail:
        if random.random() < 0.3:
            sys.exit(2)
        raise RuntimeError("asked to fail")
    return "fine"


def tiny_model() -> LoadedModel:
    import torch
    import transformers

    from agentrt.model.config import ModelConfig
    from agentrt.model.decoder import DecoderModel
    from agentrt.model.loaders.files import resolve_source
    from agentrt.model.loaders.gguf import load_gguf_tokenizer

    tok = load_gguf_tokenizer(resolve_source("smollm2-135m"))
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                                   tie_word_embeddings=True)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        hf.get_output_embeddings().weight.mul_(8.0)
    mc = ModelConfig(arch="llama", vocab_size=49152, hidden_size=48, intermediate_size=96, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=12, rope_theta=10000.0, rms_norm_eps=cfg.rms_norm_eps,
                     max_position_embeddings=8192, tie_word_embeddings=True, attention_bias=False)
    m = DecoderModel(mc)
    m.load_hf_weights(hf.state_dict())
    return LoadedModel(m.eval(), tok, mc, "tiny-random")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def soak(lm: LoadedModel, n_agents: int, turns: int, seed: int, session_ids: int) -> dict:
    rng = random.Random(seed)
    counts = {"ok": 0, "cancelled": 0, "typed_errors": 0, "pool_exhausted": 0, "tool_ok": 0, "tool_errors": 0}
    by_type: dict[str, int] = {}
    agents: dict[str, Agent] = {}
    per_agent_tokens = 700  # about what one agent's history reaches
    cfg = EngineConfig(kv_cache_tokens=16 * per_agent_tokens, max_session_seqs=session_ids, debug_invariants=True)

    async def loop(rt, i):
        agent = agents[f"a{i}"] = Agent(f"a{i}", "You call tools.", [lookup, flaky], tool_choice="required",
                                        settings=SamplingParams(max_tokens=48, temperature=1.0, seed=i),
                                        max_tool_rounds=1)
        ref = await rt.spawn(agent, name=f"a{i}")
        for turn in range(turns):
            try:
                result = await ref.ask(f"turn {turn}: use a tool", timeout=0.05 if rng.random() < 0.15 else 120)
                counts["ok"] += 1
                for r in result.tool_results:
                    counts["tool_errors" if r.is_error else "tool_ok"] += 1
            except (AskTimeout, RequestCancelled):
                counts["cancelled"] += 1
            except AgentrtError as e:  # (PoolExhausted: an ask waited acquire_timeout for a session id)
                counts["typed_errors"] += 1
                counts["pool_exhausted"] += isinstance(e, PoolExhausted)
                by_type[type(e).__name__] = by_type.get(type(e).__name__, 0) + 1

    async with Engine(lm, cfg) as eng:
        async with Runtime(eng) as rt:
            async with anyio.create_task_group() as tg:
                for i in range(n_agents):
                    tg.start_soon(loop, rt, i)
            mismatches = await _check_next_outputs(rt, eng, lm, agents)
            stats, leases = eng.stats(), rt.sessions
            await rt.stop_all()
        with anyio.fail_after(30):
            while eng.stats().running or eng.stats().waiting:
                await anyio.sleep(0.01)
        await eng.run_in_step_thread(eng.core.check_invariants)
        leaked_ids, leaked_pages = await eng.run_in_step_thread(lambda: _leaks(eng.core))
    return {**counts, "typed_errors_by_type": by_type, "agents": n_agents,
            "acquire_timeout_s": cfg.acquire_timeout, "turns": turns, "session_ids": session_ids,
            "passivations": leases.passivations, "activations": leases.activations,
            "next_output_mismatches": mismatches,
            "detached_sessions": stats.detached_sessions, "evicted_pages": stats.evicted_pages,
            "preemptions": stats.preemptions, "kv_pool_tokens": cfg.kv_cache_tokens,
            "leaked_session_ids": leaked_ids, "leaked_pages": leaked_pages}


async def _check_next_outputs(rt, eng, lm, agents: dict[str, Agent]) -> int:
    """Each agent's next greedy reply, in its session (activated again if it was passivated),
    equals naive decoding of its history."""
    bad = 0
    params = SamplingParams(max_tokens=8)
    for agent in agents.values():
        if agent.conversation is None:
            continue
        await rt.sessions.acquire(agent)
        try:
            prompt = agent.tokens + chat_format_of(eng).generation_prompt_tokens()
            out = await eng.complete(prompt, params, session=agent.session)
        finally:
            rt.sessions.release(agent)
        ref = generate(lm.model, prompt, params, eos_token_ids=lm.tokenizer.eos_token_ids)
        bad += out.token_ids != ref
    return bad


def _leaks(core) -> tuple[int, int]:
    """(session ids not back in the pool, pages in use held by no session and no radix node);
    every agent has stopped, so both must be 0."""
    held = {p for s in core.sessions.values() for p in s.seq.pages}
    if core.radix is not None:
        held |= set(core.radix.all_pages())
    used = core.alloc.num_pages - core.alloc.num_free
    ids = core.cfg.max_session_seqs - core.pool.num_free("session") \
        + (core.cfg.max_transient_seqs - core.pool.num_free("transient"))
    return ids, used - len(held)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 agents x 4 turns")
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--session-ids", type=int, default=16, help="engine session ids (agents beyond: passivated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = ap.parse_args()
    turns = args.turns or (4 if args.quick else 20)
    lm = tiny_model()
    rss0, t0 = rss_mb(), time.perf_counter()
    res = anyio.run(soak, lm, args.agents, turns, args.seed, args.session_ids)
    res.update(rss_mb_start=rss0, rss_mb_end=rss_mb(), rss_growth_mb=rss_mb() - rss0,
               wall_s=time.perf_counter() - t0, machine=machine(), quick=args.quick)
    print(json.dumps(res, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    ok = res["leaked_session_ids"] == 0 and res["leaked_pages"] == 0 and res["next_output_mismatches"] == 0 \
        and res["pool_exhausted"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
