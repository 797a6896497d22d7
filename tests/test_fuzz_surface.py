"""Fuzz the whole surface (issue 30): random sequences of valid and invalid operations on Agent,
Runtime, ChatAgentrt and the HTTP server -- asks, tells, spawns, stops, cancellations, forks,
snapshots, re-entrant asks, tools that raise or exit, server requests (malformed ones and
disconnects), and closing the engine mid-run.

Oracles: only agentrt's typed errors (or HTTP 4xx) escape; the engine's invariants hold after
every operation; at the end everything stopped is quiescent (no session id or page held).
`FUZZ_COUNTS` gathers the operations run and the errors seen (bench/soak.py reports the same
kind of counts into bench/results/reliability.json).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool
from agentrt.errors import AgentrtError
from agentrt.integrations.langgraph import ChatAgentrt
from agentrt.server import ServerConfig, ServerThread
from bench.workloads.malformed import PROBES
from tests.conftest import tiny_native_with_tokenizer
from tests.engine_util import assert_quiescent

FUZZ_COUNTS: Counter = Counter()  # written to $AGENTRT_FUZZ_COUNTS (a JSON path) when set


def teardown_module() -> None:
    if out := os.environ.get("AGENTRT_FUZZ_COUNTS"):
        Path(out).write_text(json.dumps(dict(sorted(FUZZ_COUNTS.items())), indent=1) + "\n")


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-{key[:6]}"


@tool
def explode(mode: str) -> str:
    """Fail in one of several ways."""
    if mode.startswith("e"):
        sys.exit(2)  # as argparse does: contained as a tool error
    raise RuntimeError(f"asked to fail: {mode[:6]}")


@tool
async def ask_myself(question: str) -> str:
    """Ask the agent that called this tool (a re-entrant ask: refused with AskCycle)."""
    return await RUNTIME[0].get(RUNTIME[1]).ask(question, timeout=5)


RUNTIME: list = []  # (runtime, agent name) for ask_myself; set per example
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

_name = st.sampled_from(["a", "a", "a", "b", "b", "c", "", 5])  # a and b are spawned first; c, "" and 5 not
_message = st.one_of(st.sampled_from(["look up key x", "hi", "", "explode e", "ask yourself"]),
                     st.sampled_from([5, None, [1, 2], {"role": "user", "content": "look up k"}]))
_OPS = {
    "ask": st.tuples(st.just("ask"), _name, _message, st.sampled_from([None, 0.0, 0.05, 30.0])),
    "spawn": st.tuples(st.just("spawn"), _name, st.sampled_from(["ok", "ok", "bad_tool", "bad_settings", "bad_choice"])),
    "tell": st.tuples(st.just("tell"), _name, _message),
    "stop": st.tuples(st.just("stop"), _name),
    "fork": st.tuples(st.just("fork"), _name, st.sampled_from(["d", "e", "a"])),
    "snapshot": st.tuples(st.just("snapshot"), _name),
    "chat": st.tuples(st.just("chat"), st.sampled_from(["ok", "image", "bad_choice", "bad_kwarg"])),
    "http": st.tuples(st.just("http"), st.one_of(st.integers(0, len(PROBES) - 1),  # a malformed probe
                                                  st.integers(len(PROBES), len(PROBES) + 2))),  # live ones
}
# asks weigh most (4 in 12 draws); http draws a malformed probe, a dropped stream or a session's turn
_op = st.sampled_from([*["ask"] * 4, *_OPS, "http"]).flatmap(lambda kind: _OPS[kind])
# closing the engine mid-run: at a random point of some examples
_close_at = st.one_of(st.none(), st.integers(0, 11))


def _agent(kind: str, name) -> Agent:
    tools = {"bad_tool": [lookup, 5]}.get(kind, [lookup, explode, ask_myself])
    settings_ = SamplingParams(max_tokens=16, temperature=0) if kind != "bad_settings" else {"max_tokens": "x"}
    choice = "required" if kind != "bad_choice" else "sometimes"
    return Agent(name, "Call a tool.", tools, settings=settings_, tool_choice=choice, max_tool_rounds=1)


class Surface:
    """What one example drives: an engine with a Runtime and a ChatAgentrt, and the server."""

    def __init__(self, eng: Engine, rt: Runtime, server: ServerThread, tmp) -> None:
        self.eng, self.rt, self.server, self.tmp = eng, rt, server, tmp
        self.refs: dict = {}
        self.closed = False

    async def run(self, op) -> None:
        FUZZ_COUNTS[f"op:{op[0]}"] += 1
        await getattr(self, f"_{op[0]}")(*op[1:])

    async def _spawn(self, name, kind) -> None:
        self.refs[name] = await self.rt.spawn(_agent(kind, name), name=name)

    async def _ask(self, name, message, timeout) -> None:
        if message == "ask yourself":
            RUNTIME[:] = [self.rt, name]
        await self.rt.get(name).ask(message, timeout=timeout)

    async def _tell(self, name, message) -> None:
        await self.rt.get(name).tell(message)

    async def _stop(self, name) -> None:
        await self.rt.get(name).stop()

    async def _fork(self, src, dst) -> None:
        await self.rt.fork(src, name=dst)

    async def _snapshot(self, name) -> None:
        session = self.rt.get(name).behavior.session
        if session is not None:
            path = await session.snapshot(self.tmp / f"{name}.kv")
            async with await self.eng.restore(path, timeout=0.0):
                pass

    async def _chat(self, kind) -> None:
        model = ChatAgentrt(engine=self.eng, max_tokens=8, api_key="fuzz-key")
        msg = HumanMessage("Say hi.")
        if kind == "image":
            msg = HumanMessage(content=[{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}])
        if kind == "bad_choice":
            model = model.bind_tools([WEATHER], tool_choice="nonsense")
        if kind == "bad_kwarg":
            await model.ainvoke([msg], max_tokens="5")
            return
        await model.ainvoke([msg])

    async def _http(self, index) -> None:
        url = self.server.url
        h = {"Authorization": "Bearer fuzz-key-0123"}
        async with httpx.AsyncClient(timeout=60) as client:
            if index < len(PROBES):
                p = PROBES[index]
                r = await client.post(url + p["path"], content=p.get("raw") or httpx.Request(
                    "POST", url, json=p.get("body")).content, headers={**h, "Content-Type": "application/json"})
            elif index == len(PROBES):  # a stream dropped after its first chunk
                body = {"messages": [{"role": "user", "content": "Count to 50."}], "max_tokens": 60, "stream": True}
                async with client.stream("POST", url + "/chat/completions", json=body, headers=h) as r:
                    async for _ in r.aiter_lines():
                        break
            else:
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "prompt_cache_key": "f"}
                r = await client.post(url + "/chat/completions", json=body, headers=h)
        FUZZ_COUNTS[f"http:{r.status_code}"] += 1
        assert r.status_code < 500, r.text

    async def _close_engine(self) -> None:
        if not self.closed:
            self.closed = True
            await self.eng.aclose()

    async def check(self) -> None:
        if self.closed:
            self.eng.core.check_invariants()  # (the step thread has stopped)
        else:
            await self.eng.run_in_step_thread(self.eng.core.check_invariants)


@pytest.fixture(scope="module")
def server():
    cfg = ServerConfig(port=0, api_keys=("fuzz-key-0123",), max_tokens_limit=128, max_request_bytes=1 << 20)
    with ServerThread(tiny_native_with_tokenizer(), cfg, EngineConfig(kv_cache_tokens=4096)) as s:
        yield s


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=4, max_size=14), close_at=_close_at)
def test_the_whole_surface_gives_typed_errors_keeps_invariants_and_ends_quiescent(server, tmp_path, ops, close_at):
    untyped: list[str] = []
    ops = [("spawn", "a", "ok"), ("spawn", "b", "ok"), *ops]
    if close_at is not None:
        ops.insert(2 + min(close_at, len(ops) - 2), ("close_engine",))

    async def main():
        cfg = EngineConfig(kv_cache_tokens=3072, max_session_seqs=3, debug_invariants=True)
        async with Engine(tiny_native_with_tokenizer(), cfg) as eng:
            async with Runtime(eng, shutdown_timeout=5) as rt:
                surface = Surface(eng, rt, server, tmp_path)
                for op in ops:
                    try:
                        with anyio.fail_after(90):  # never a hang
                            await surface.run(op)
                        FUZZ_COUNTS[f"ok:{op[0]}"] += 1
                    except AgentrtError as e:
                        FUZZ_COUNTS[f"error:{type(e).__name__}"] += 1
                    except Exception as e:  # noqa: BLE001 - the point: nothing untyped may escape
                        untyped.append(f"{op}: {type(e).__name__}: {e}")
                    await surface.check()
                await rt.stop_all()
            if not surface.closed:
                with anyio.fail_after(30):
                    while eng.stats().running or eng.stats().waiting:
                        await anyio.sleep(0.01)
                await eng.run_in_step_thread(lambda: assert_quiescent(eng.core))
                assert eng.core.pool.num_free("session") == cfg.max_session_seqs
        assert not surface.closed or eng.closed

    anyio.run(main)
    assert not untyped, untyped
    r = httpx.get(f"{server.url.removesuffix('/v1')}/health")
    assert r.status_code == 200
    with server.state.engine._steps.lock:
        server.state.engine.core.check_invariants()
