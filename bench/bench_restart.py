"""Nothing lost on restart (issue 59): the durable state store and the disk KV tier, measured.

Parts (all by default; --parts picks some), on the embedded SmolLM2-135M unless named:
  resume    8 agents with ~2,000-token histories (their own instructions; one turn each) on an
            engine over a state dir; the process "restarts" (a new engine over the same dir);
            each agent's next turn, one at a time: the share of its prompt computed, and its
            TTFT against the same restart without a state dir (everything recomputed).
  crash     SIGKILL at random moments of a soak of agent turns with tool calls and stored
            responses (bench/restart_soak.py, a tiny model), then reopen and verify.
  overhead  the same session workload (4 sessions x 8 turns) with the state dir on and off,
            alternated: the mean turn's extra time.
  long      bench_agents' long case (8 agents, long contexts, KV pool 60%) with a host tier too
            small to hold what the pool evicts, with and without the disk tier below it.
  postgres  two servers sharing one PostgreSQL state store (and state dir): a Responses chain
            alternating between them; every link must resolve.
Writes bench/results/restart.json. Record the CPU kind and the disk; run alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from agentrt import Engine, EngineConfig, SamplingParams
from bench.common import ROOT, machine, print_table, write_results

PARTS = ("resume", "overhead", "long", "postgres", "crash")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions: minutes on 2 cores")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--kills", type=int, default=200, help="crash: SIGKILLs of the soak (default 200)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output path (default bench/results/restart.json)")
    return ap.parse_args()


def disk_facts(path: str) -> dict:
    """The file system and device the state dir lives on (what fsync costs depends on them)."""
    out = subprocess.run(["df", "-T", path], capture_output=True, text=True).stdout.splitlines()
    fields = out[-1].split() if len(out) > 1 else []
    dev = fields[0] if fields else "unknown"
    rota = Path(f"/sys/block/{Path(dev).name.rstrip('0123456789')}/queue/rotational")
    return {"device": dev, "fs": fields[1] if len(fields) > 1 else "unknown",
            "rotational": rota.read_text().strip() == "1" if rota.exists() else None}


# ---- resume ---------------------------------------------------------------------------
class Chat:
    """ChatML ids by hand (the tokenizer's encode spells special tokens as text)."""

    def __init__(self, tok) -> None:
        self.tok, self.start, self.end = tok, tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")

    def turn(self, role: str, text: str) -> list[int]:
        return [self.start, *self.tok.encode(f"{role}\n{text}"), self.end, *self.tok.encode("\n")]

    def ask(self, text: str) -> list[int]:
        return self.turn("user", text) + [self.start, *self.tok.encode("assistant\n")]


def instructions(i: int, tok, n_tokens: int) -> str:
    """Agent i's own instructions, about n_tokens long."""
    words = [f"Agent {i} keeps the ledger of warehouse {i}.", "Rule {k}: item {k} moves to shelf {s} when its count "
             "drops below {c}, and the change is written down with the date and the clerk's initials."]
    text, k = words[0], 0
    while len(tok.encode(text)) < n_tokens:
        text += " " + words[1].format(k=k, s=(k * 7 + i) % 50, c=(k * 3 + i) % 20 + 1)
        k += 1
    return text


async def _warm(eng: Engine) -> None:
    await eng.complete(list(range(300, 364)), SamplingParams(max_tokens=2, ignore_eos=True))


async def _next_turn(eng: Engine, key: str, prompt: list[int]) -> tuple[float, object]:
    """TTFT (seconds from the call, the disk read included) and usage of one turn."""
    p = SamplingParams(max_tokens=8, temperature=0.0)
    async with await eng.open_session(key=key) as s:
        t0, ttft, usage = time.perf_counter(), None, None
        async for ev in eng.generate(prompt, p, session=s):
            ttft = ttft or time.perf_counter() - t0
            usage = ev.usage or usage
    return ttft, usage


async def resume(lm, agents: int, hist: int, state_dir: str) -> dict:
    chat = Chat(lm.tokenizer)
    cfg = EngineConfig(kv_cache_tokens=32768, response_cache_size=0)
    prompts = [chat.turn("system", instructions(i, lm.tokenizer, hist - 40)) + chat.ask("What is rule 3 about?")
               for i in range(agents)]
    histories = []
    async with Engine(lm, cfg.replace(state_dir=state_dir)) as eng:  # the first process
        for i, p in enumerate(prompts):
            async with await eng.open_session(key=f"agent{i}") as s:
                c = await eng.complete(p, SamplingParams(max_tokens=16, temperature=0.0), session=s)
                histories.append(p + c.token_ids)
        eng.core.disk.flush()
    nxt = [h + chat.ask("And rule 5?") for h in histories]
    runs = {}
    for name, c in (("restored", cfg.replace(state_dir=state_dir)), ("cold", cfg)):
        async with Engine(lm, c) as eng:  # the restarted process (cold: no state dir)
            await _warm(eng)
            runs[name] = [await _next_turn(eng, f"agent{i}", p) for i, p in enumerate(nxt)]
    restored, cold = runs["restored"], runs["cold"]
    computed = sum(u.computed_prompt_tokens for _, u in restored)
    submitted = sum(u.prompt_tokens for _, u in restored)
    out = {"agents": agents, "history_tokens_mean": statistics.mean(map(len, histories)),
           "resume_prompt_tokens_computed_fraction": computed / submitted,
           "resume_ttft_s_mean": statistics.mean(t for t, _ in restored),
           "cold_ttft_s_mean": statistics.mean(t for t, _ in cold),
           "cold_prompt_tokens_computed_fraction": sum(u.computed_prompt_tokens for _, u in cold) / submitted}
    out["resume_ttft_over_cold"] = out["resume_ttft_s_mean"] / out["cold_ttft_s_mean"]
    return out


# ---- overhead -----------------------------------------------------------------------
async def _workload(lm, cfg: EngineConfig, sessions: int, turns: int) -> float:
    """Mean seconds per turn of `sessions` sessions x `turns` turns, run concurrently."""
    chat, times = Chat(lm.tokenizer), []

    async def one(i: int, eng: Engine) -> None:
        toks = chat.turn("system", instructions(i, lm.tokenizer, 300))
        async with await eng.open_session(key=f"s{i}") as s:
            for t in range(turns):
                toks = toks + chat.ask(f"Step {t}: check rule {t * 3 + i} and say what moves where. " * 4)
                t0 = time.perf_counter()
                c = await eng.complete(toks, SamplingParams(max_tokens=16, temperature=0.0), session=s)
                times.append(time.perf_counter() - t0)
                toks = toks + c.token_ids
    async with Engine(lm, cfg) as eng:
        await _warm(eng)
        async with anyio.create_task_group() as tg:
            for i in range(sessions):
                tg.start_soon(one, i, eng)
    return statistics.mean(times)


def overhead(lm, reps: int) -> dict:
    cfg = EngineConfig(kv_cache_tokens=32768, response_cache_size=0)
    on, off = [], []
    for r in range(reps):
        d = tempfile.mkdtemp(prefix="agentrt-overhead-")
        for name in (("off", "on") if r % 2 else ("on", "off")):
            c = cfg.replace(state_dir=d) if name == "on" else cfg
            (on if name == "on" else off).append(anyio.run(_workload, lm, c, 4, 8))
        shutil.rmtree(d, ignore_errors=True)
    return {"turn_s_state_on": on, "turn_s_state_off": off,
            "durability_overhead_per_turn": statistics.median(on) / statistics.median(off) - 1.0}


# ---- long (bench_agents' long case) -----------------------------------------------------
def long_case(lm, quick: bool, tier_bytes: int) -> dict:
    from agentrt.conversation.chat_format import ChatFormat
    from bench.agents_report import ratios, summarize
    from bench.cases.agents_cases import kv_tokens
    from bench.cases.memory_cases import memory_cases
    from bench.peers.agentrt_peer import AgentrtSystem

    fmt = ChatFormat(lm.tokenizer)
    case = next(c for c in memory_cases(fmt, lm.tokenizer, quick=quick) if c.key == "long8_p60")
    scripts = case.make(0)
    kv = kv_tokens(scripts, case.pool_fraction)
    base = EngineConfig(kv_cache_tokens=kv, response_cache_size=0, max_session_seqs=32, max_transient_seqs=32,
                        kv_tier_bytes=tier_bytes)
    out = {}
    for name in ("small_tier", "small_tier_disk"):
        d = tempfile.mkdtemp(prefix="agentrt-long-") if name.endswith("disk") else None
        system = AgentrtSystem("agentrt", lm, base.replace(state_dir=d), sessions=True, hints=True)
        system.config = base.replace(state_dir=d)  # (the small tier as given, not the peer's default)
        anyio.run(system.warmup)
        out[name] = summarize(anyio.run(system.run, scripts, case.arrival))
        if d:
            shutil.rmtree(d, ignore_errors=True)
    r = ratios(out["small_tier_disk"], out["small_tier"])
    return {"case": case.key, "kv_cache_tokens": kv, "kv_tier_bytes": tier_bytes,
            "hit_rate": {k: v["hit_rate"] for k, v in out.items()},
            "mean_turn_ms": {k: v["mean_turn_ms"] for k, v in out.items()},
            "exact": {k: v["exact"] for k, v in out.items()},
            "disk_tier_hit_rate_gain": out["small_tier_disk"]["hit_rate"] - out["small_tier"]["hit_rate"],
            "per_turn_speedup": r["per_turn_speedup"]}


# ---- postgres -------------------------------------------------------------------------
def postgres_chain(lm, links: int) -> dict:
    import openai

    from agentrt.server import ServerConfig, ServerThread
    from tests.pg_server import PostgresServer

    state_dir = tempfile.mkdtemp(prefix="agentrt-pg-")
    with PostgresServer() as pg:
        if pg.url is None:
            return {"status": "not run", "reason": pg.why}
        cfg = EngineConfig(kv_cache_tokens=16384, state_dir=state_dir, state_url=pg.url)
        sc = ServerConfig(port=0, model_name="smol")
        with ServerThread(lm, sc, cfg) as a, ServerThread(lm, sc, cfg) as b:
            clients = [openai.OpenAI(base_url=s.url, api_key="none", max_retries=0) for s in (a, b)]
            prev, rows = None, []
            for k in range(links):
                c = clients[k % 2]
                try:
                    r = c.responses.create(model="smol", input=f"Question {k}: name a colour.",
                                           previous_response_id=prev, max_output_tokens=12, temperature=0)
                except openai.APIStatusError as e:
                    rows.append({"link": k, "server": "ab"[k % 2], "status": e.status_code})
                    break
                usage = r.usage.model_extra["agentrt"]
                rows.append({"link": k, "server": "ab"[k % 2], "status": 200, "input_tokens": r.usage.input_tokens,
                             "computed_input_tokens": usage["computed_input_tokens"]})
                prev = r.id
    shutil.rmtree(state_dir, ignore_errors=True)
    return {"links": rows, "postgres_chain_across_replicas": len(rows) == links and all(
        x["status"] == 200 for x in rows)}


# ---- crash ----------------------------------------------------------------------------
def crash(kills: int) -> dict:
    """bench/restart_soak.py in a fresh interpreter (it forks; this process has threads)."""
    d = tempfile.mkdtemp(prefix="agentrt-soak-")
    code = f"import json; from bench.restart_soak import soak; print(json.dumps(soak({d!r}, kills={kills})))"
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        return {"status": "failed", "stderr": out.stderr[-2000:]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["soak_s"] = time.perf_counter() - t0
    r["turns_acknowledged_per_run_mean"] = statistics.mean(r.pop("turns_acknowledged_per_run"))
    shutil.rmtree(d, ignore_errors=True)
    return r


def main() -> None:
    args = parse_args()
    parts = [p for p in args.parts.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        sys.exit(f"unknown part(s) {sorted(unknown)}; known: {', '.join(PARTS)}")
    from agentrt.model.loaders.load import load_model

    lm = load_model("smollm2-135m")
    scratch = tempfile.mkdtemp(prefix="agentrt-restart-")
    out: dict = {"machine": machine(), "disk": disk_facts(scratch), "quick": args.quick}
    if "resume" in parts:
        out["resume"] = anyio.run(resume, lm, 8, 2000, scratch)
    if "overhead" in parts:
        out["overhead"] = overhead(lm, 2 if args.quick else 4)
    if "long" in parts:
        out["long"] = long_case(lm, args.quick, 64 << 20)
    if "postgres" in parts:
        out["postgres"] = postgres_chain(lm, 6)
    if "crash" in parts:
        out["crash"] = crash(args.kills)
    shutil.rmtree(scratch, ignore_errors=True)
    report(out)
    path = write_results("restart", out) if args.out is None else _write(args.out, out)
    print(f"wrote {path}")


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str))
    return path


def report(out: dict) -> None:
    rows = []
    for part, key, goal in (("resume", "resume_prompt_tokens_computed_fraction", "<= 0.05"),
                            ("resume", "resume_ttft_over_cold", "<= 0.1"),
                            ("crash", "crash_kills", ">= 200"), ("crash", "corrupt_records_used", "0"),
                            ("crash", "acknowledged_responses_lost", "0"),
                            ("overhead", "durability_overhead_per_turn", "<= 0.03"),
                            ("long", "disk_tier_hit_rate_gain", "report"), ("long", "per_turn_speedup", ">= 1.5"),
                            ("postgres", "postgres_chain_across_replicas", "every link")):
        if part in out:
            v = out[part].get(key, out[part].get("reason"))
            rows.append([key, f"{v:.4f}" if isinstance(v, float) else str(v), goal])
    print_table("restart (issue 59)", ["key", "measured", "goal"], rows)


if __name__ == "__main__":
    main()
