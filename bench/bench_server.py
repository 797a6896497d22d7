"""`agentrt serve` over HTTP vs the same workload in-process vs llama-cpp-python's OpenAI server.

Workload: N concurrent tool-calling conversations of T turns on the embedded SmolLM2 GGUF. A turn
is two requests, as an agent framework sends them: the question with a `get_weather` tool
(named tool choice: one call), then, with the tool's result appended, the answer (the tool still
offered, tool_choice "none", max_tokens 24). Every request resends the whole history; agentrt's requests carry the
conversation's `prompt_cache_key`. Greedy decoding; requests stream (TTFT = first delta).

  * agentrt_http: the OpenAI client (AsyncOpenAI) against `agentrt serve` (its own process) on
    127.0.0.1;
  * agentrt_inprocess: the server's own request path (`server.chat.prepare` + `run`) called
    directly on an engine in this process: the same sessions, no HTTP/JSON/SSE;
  * llamacpp_server: `python -m llama_cpp.server` on the same GGUF, 2 threads, chat format
    chatml-function-calling (its named tool choice is grammar-constrained), same client.
Per turn: the wall time of its two requests. Keys: server_overhead_vs_inprocess (median
per-turn http / in-process, per repetition (the two alternate), then the median; goal <= 1.1), per_turn_speedup_vs_llamacpp_server (median per-turn
llama.cpp / agentrt http at 8 conversations; goal >= 2), ttft p50/p99 per system. Generated
lengths differ between the systems' models (different numerics): tokens per turn are reported.
Each system first runs two warm-up conversations (grammar compile, kernels), not measured.

    python -m bench.bench_server [--quick] [--no-install]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

from bench.common import machine, print_table, write_results  # noqa: E402
from bench.peers.llamacpp_peer import ensure_llama_cpp, llama_cpp_missing  # noqa: E402

CITIES = ["Paris", "Tokyo", "Oslo", "Lima", "Rome", "Cairo", "Delhi", "Quito", "Seoul", "Berlin"]
SYSTEM = "You are a weather assistant. Look the weather up with get_weather, then answer in one sentence."
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CALL_TOKENS, ANSWER_TOKENS, KV_TOKENS = 32, 24, 32768


def _result(city: str) -> str:
    return json.dumps({"city": city, "temperature_c": 10 + len(city), "sky": "clear"})


async def conversation(send, conv: int, turns: int, out: list) -> None:
    """One conversation: per turn, a call request and an answer request through `send`."""
    msgs = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        city = CITIES[(conv + t) % len(CITIES)]
        msgs.append({"role": "user", "content": f"What is the weather in {city}?"})
        t0 = time.perf_counter()
        call = await send(msgs, f"conv-{conv}", tools=[TOOL], tool_choice=NAMED, max_tokens=CALL_TOKENS)
        calls = call["tool_calls"] or [{"id": "call_0", "type": "function",
                                        "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]
        msgs.append({"role": "assistant", "content": call["content"] or "", "tool_calls": calls})
        msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": _result(city)})
        answer = await send(msgs, f"conv-{conv}", tools=[TOOL], tool_choice="none", max_tokens=ANSWER_TOKENS)
        msgs.append({"role": "assistant", "content": answer["content"] or ""})
        out.append({"conv": conv, "turn": t, "s": time.perf_counter() - t0, "ttft": [call["ttft"], answer["ttft"]],
                    "tokens": call["tokens"] + answer["tokens"], "cached": call["cached"] + answer["cached"],
                    "prompt": call["prompt"] + answer["prompt"], "called": bool(call["tool_calls"])})


async def openai_sender(base_url: str, cache_key: bool):
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench-key-0", max_retries=0, timeout=600)

    async def send(msgs, key, tools=None, tool_choice=None, max_tokens=32):
        kw = {"tools": tools, "tool_choice": tool_choice} if tools else {}
        extra = {"prompt_cache_key": key} if cache_key else {}
        t0, ttft, content, calls, usage, pieces = time.perf_counter(), None, [], {}, None, 0
        stream = await client.chat.completions.create(
            model="m", messages=msgs, temperature=0, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=extra, **kw)
        async for c in stream:
            usage = c.usage or usage
            for ch in c.choices:
                d = ch.delta
                if d.content or d.tool_calls:
                    ttft = ttft or time.perf_counter() - t0
                    pieces += 1
                content.append(d.content or "")
                for tc in d.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": tc.id or f"call_{tc.index}", "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
                    if tc.function and tc.function.name:  # (llama.cpp repeats the name in every delta)
                        slot["function"]["name"] = tc.function.name
                    slot["function"]["arguments"] += (tc.function.arguments or "") if tc.function else ""
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        return {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)] or None,
                # (llama.cpp's stream has no usage: one streamed piece per token)
                "ttft": ttft or time.perf_counter() - t0, "tokens": usage.completion_tokens if usage else pieces,
                "prompt": usage.prompt_tokens if usage else 0,
                "cached": (getattr(details, "cached_tokens", 0) or 0) if details else 0}
    return send, client


def inprocess_sender(state):
    from agentrt.conversation.conversation import RoundEnd
    from agentrt.server import chat
    from agentrt.server.protocol import ChatRequest
    from agentrt.toolcall import ArgumentsDelta, CallStarted, TextDelta

    async def send(msgs, key, tools=None, tool_choice=None, max_tokens=32):
        body = {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "prompt_cache_key": key}
        if tools:
            body |= {"tools": tools, "tool_choice": tool_choice}
        t0, ttft = time.perf_counter(), None
        call = chat.prepare(ChatRequest.model_validate(body), f"anon:{key}", "m")
        end = None
        async for ev in chat.run(call, state):
            if isinstance(ev, (TextDelta, CallStarted, ArgumentsDelta)) and ttft is None:
                ttft = time.perf_counter() - t0
            end = ev if isinstance(ev, RoundEnd) else end
        body = chat.response(call, end)
        m, u = body["choices"][0]["message"], body["usage"]
        return {"content": m["content"], "tool_calls": m.get("tool_calls"), "ttft": ttft or time.perf_counter() - t0,
                "tokens": u["completion_tokens"], "prompt": u["prompt_tokens"],
                "cached": u["prompt_tokens_details"]["cached_tokens"]}
    return send


async def drive(send, n: int, turns: int, offset: int = 0) -> list:
    out: list = []
    await asyncio.gather(*(conversation(send, offset + c, turns, out) for c in range(n)))
    return out


def run_http(n: int, turns: int) -> list:
    """`agentrt serve` in its own process (a client in the server's process would share its GIL)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "agentrt.cli", "serve", "--port", str(port), "--served-model-name", "m",
           "--kv-cache-tokens", str(KV_TOKENS), "--log-level", "warning"]
    with _process(cmd, f"http://127.0.0.1:{port}/health"):
        async def main():
            send, client = await openai_sender(f"http://127.0.0.1:{port}/v1", cache_key=True)
            async with client:
                await drive(send, 2, 1, offset=100)  # warm-up: grammar compile, kernels
                return await drive(send, n, turns)
        return asyncio.run(main())


def run_inprocess(lm, n: int, turns: int, engine_cfg) -> list:
    from agentrt import Engine
    from agentrt.conversation.router import SessionPolicy, SessionRouter
    from agentrt.server import ServerConfig

    async def main():
        async with Engine(lm, engine_cfg) as engine:
            state = SimpleNamespace(engine=engine, config=ServerConfig(model_name="m"),
                                    router=SessionRouter(engine, SessionPolicy(256, 900.0)))
            await drive(inprocess_sender(state), 2, 1, offset=100)  # warm-up, as for the servers
            out = await drive(inprocess_sender(state), n, turns)
            await state.router.release_prefix("")
            return out
    return asyncio.run(main())


def run_llamacpp(path: str, n: int, turns: int) -> list:
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", path, "--n_threads", "2", "--n_threads_batch", "2",
           "--n_ctx", "8192", "--chat_format", "chatml-function-calling", "--host", "127.0.0.1", "--port", str(port),
           "--interrupt_requests", "False"]  # (its default: a new request cuts the one streaming)
    with _process(cmd, f"http://127.0.0.1:{port}/v1/models"):
        async def main():
            send, client = await openai_sender(f"http://127.0.0.1:{port}/v1", cache_key=False)
            async with client:
                await drive(send, 2, 1, offset=100)
                return await drive(send, n, turns)
        return asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _process(cmd: list[str], ready_url: str):
    log = tempfile.TemporaryFile("w+")  # (a pipe would fill with the server's log and stall it)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        _wait_up(proc, log, ready_url)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _wait_up(proc, log, url: str, timeout: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{proc.args[2]} exited: {log.read()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{proc.args[2]} did not start")


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def summary(rows: list) -> dict:
    turns, ttfts = [r["s"] for r in rows], [t for r in rows for t in r["ttft"]]
    prompt = sum(r["prompt"] for r in rows)
    return {"turns": len(rows), "per_turn_s_median": statistics.median(turns), "per_turn_s_p99": _q(turns, 0.99),
            "ttft_s_p50": _q(ttfts, 0.5), "ttft_s_p99": _q(ttfts, 0.99),
            "tokens_per_turn": statistics.mean(r["tokens"] for r in rows),
            "cached_fraction": sum(r["cached"] for r in rows) / prompt if prompt else 0.0,
            "calls_made": sum(r["called"] for r in rows) / len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 conversations x 3 turns, 2 repetitions (minutes)")
    ap.add_argument("--no-install", action="store_true", help="do not install llama-cpp-python when missing")
    args = ap.parse_args()
    from agentrt import EngineConfig, load_model
    from agentrt.model.loaders.files import resolve_source

    ensure_llama_cpp(not args.no_install)
    ensure_llama_cpp_server(not args.no_install)
    n, turns, reps = (8, 3, 2) if args.quick else (8, 6, 3)
    lm, cfg = load_model("smollm2-135m"), EngineConfig(kv_cache_tokens=KV_TOKENS)
    gguf = str(resolve_source("smollm2-135m"))
    t_start = time.perf_counter()
    systems: dict[str, dict] = {}
    runs: dict[str, list] = {"agentrt_inprocess": [], "agentrt_http": []}
    ratios = []
    for _ in range(reps):  # alternating, so slow phases of this shared machine hit both
        runs["agentrt_inprocess"].append(run_inprocess(lm, n, turns, cfg))
        runs["agentrt_http"].append(run_http(n, turns))
        ratios.append(statistics.median(r["s"] for r in runs["agentrt_http"][-1])
                      / statistics.median(r["s"] for r in runs["agentrt_inprocess"][-1]))
    for name, rs in runs.items():
        systems[name] = summary([r for rep in rs for r in rep])
    reasons = {}
    if (why := llama_cpp_missing()) is None and _has_server():
        systems["llamacpp_server"] = summary(run_llamacpp(gguf, n, turns))
    else:
        reasons["llamacpp_server"] = why or f"llama_cpp.server needs its extras: pip install {' '.join(SERVER_EXTRAS)}"
    http = systems["agentrt_http"]
    out = {"machine": machine(), "quick": args.quick, "conversations": n, "turns": turns, "systems": systems,
           "server_overhead_vs_inprocess": statistics.median(ratios), "server_overhead_per_rep": ratios,
           "reps": reps,
           "ttft_p50_s": http["ttft_s_p50"], "ttft_p99_s": http["ttft_s_p99"], "reasons": reasons,
           "bench_wall_s": time.perf_counter() - t_start,
           "notes": ["per turn = a tool-call request + an answer request, each resending the history",
                     "generated lengths differ between systems (tokens_per_turn); greedy, streamed"]}
    if "llamacpp_server" in systems:
        out["per_turn_speedup_vs_llamacpp_server"] = (systems["llamacpp_server"]["per_turn_s_median"]
                                                      / http["per_turn_s_median"])
    rows = [[k, f"{v['per_turn_s_median'] * 1e3:.0f}", f"{v['per_turn_s_p99'] * 1e3:.0f}", f"{v['ttft_s_p50'] * 1e3:.0f}",
             f"{v['ttft_s_p99'] * 1e3:.0f}", f"{v['tokens_per_turn']:.1f}", f"{v['cached_fraction']:.2f}",
             f"{v['calls_made']:.2f}"] for k, v in systems.items()]
    print_table(f"{n} conversations x {turns} turns", ["system", "turn p50 ms", "turn p99 ms", "TTFT p50 ms",
                "TTFT p99 ms", "tokens/turn", "cached", "calls/turn"], rows)
    print(json.dumps({k: v for k, v in out.items() if not isinstance(v, (dict, list))}, indent=1))
    print("wrote", write_results("server", out))


SERVER_EXTRAS = ["sse-starlette>=2", "starlette-context>=0.3", "pydantic-settings>=2", "PyYAML>=5.1"]


def _has_server() -> bool:
    try:
        import llama_cpp.server.app  # noqa: F401
    except Exception:  # noqa: BLE001 - missing extras or a broken install
        return False
    return True


def ensure_llama_cpp_server(allowed: bool) -> None:
    """llama-cpp-python's `[server]` extras (small, pure Python) when llama_cpp is here without them."""
    if not allowed or llama_cpp_missing() is not None or _has_server():
        return
    print("installing llama_cpp.server's extras:", " ".join(SERVER_EXTRAS), flush=True)
    if subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *SERVER_EXTRAS], check=False).returncode:
        print("warning: llama_cpp.server's extras could not be installed; its rows are reported as not run",
              file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
