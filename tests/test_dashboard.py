"""The dashboard's data and front doors without a browser: a snapshot carries stats()'s own
numbers and what they sum (sessions' pages, the tree by agent, the workflow DAG, the agents); an
agent's turns land on the timeline with the engine's queue / prefill / decode and their tools;
the page, its static files and the event stream are served by `dashboard.serve` and by
`agentrt serve --dashboard`; bad arguments and a port in use are typed errors."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import urllib.request

import anyio
import pytest

pytest.importorskip("starlette")

from agentrt import Agent, Engine, Runtime, SamplingParams, Workflow, dashboard, task_scope  # noqa: E402
from agentrt.dashboard.app import Dashboard  # noqa: E402
from agentrt.errors import ConfigError  # noqa: E402
from tests.conftest import tiny_native_with_tokenizer  # noqa: E402
from tests.dashboard_util import CFG, lookup  # noqa: E402


def _get(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.headers.get("content-type", ""), r.read()


def _two_agents(check) -> None:
    """Two agents through a declared workflow (one task, the planner's tool call first); then
    check(engine, runtime) in a worker thread, as a dashboard thread would read them."""

    async def main():
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
            eng.declare_workflow(Workflow.chain("pair", "planner", "coder"))
            refs = [await rt.spawn(Agent("planner", "Plan.", [lookup], tool_choice="required", max_tool_rounds=1,
                                         settings=SamplingParams(max_tokens=40))),
                    await rt.spawn(Agent("coder", "Code.", settings=SamplingParams(max_tokens=6)))]
            with task_scope("job-1", workflow="pair"):
                for ref in refs:
                    await ref.ask("go", timeout=60)
            await anyio.to_thread.run_sync(check, eng, rt)

    anyio.run(main)


def test_a_snapshot_is_stats_and_what_it_sums():
    def check(eng, rt):
        snap = Dashboard(rt).sample()
        assert snap["stats"] == json.loads(json.dumps(dataclasses.asdict(eng.stats())))  # (idle: nothing moves)
        assert {a["name"] for a in snap["agents"]} == {"planner", "coder"}
        rows = {s["agent"]: s for s in snap["sessions"]}
        assert set(rows) == {"planner", "coder"} and snap["stats"]["sessions"] == 2
        for a in snap["agents"]:
            row = rows[a["name"]]
            assert a["session"] == row["session"] and a["tokens"] >= row["tokens"] > 0
            pages = row["resident_pages"] + row["demoted_pages"] + row["dropped_pages"]
            assert pages == -(-row["history_tokens"] // snap["page_size"])
        assert snap["tree"]["planner"][0] > 0  # its finished turns' pages, in the prefix cache
        (wf,) = snap["workflows"]
        assert wf["name"] == "pair" and wf["edges"] == [["planner", "coder"]]
        assert sum(n for run, between in wf["tasks"].values() for n in (run, between)) == 1  # job-1, just done
        assert len(snap["history"]) == 1 and snap["history"][0]["hit_rate"] == snap["stats"]["hit_rate"]

    _two_agents(check)


def test_agent_turns_land_on_the_timeline():
    def check(eng, rt):
        turns = Dashboard(rt).sample()["turns"]
        assert [t["agent"] for t in turns] == ["planner", "coder"] and {t["task"] for t in turns} == {"job-1"}
        planner, coder = turns
        kinds = [s[0] for s in planner["segments"]]
        assert "tool" in kinds and kinds.count("decode") == 2  # two rounds around its tool call
        assert "tool" not in [s[0] for s in coder["segments"]]
        for t in turns:
            assert t["start"] <= t["segments"][0][1] and t["segments"][-1][2] <= t["end"]
            assert all(a <= b for _, a, b in t["segments"])
            assert t["completion_tokens"] > 0

    _two_agents(check)


def test_usage_splits_a_request_into_queue_prefill_and_decode():
    async def main():
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng:
            return await eng.complete(list(range(100, 400)), SamplingParams(max_tokens=8, ignore_eos=True))

    c = anyio.run(main)
    u = c.usage
    assert u.prefill_s > 0 and u.decode_s > 0 and u.queue_wait_s >= 0


def test_serve_on_a_free_port_serves_the_page_and_the_stream():
    def check(eng, rt):
        with dashboard.serve(rt, port=0, interval=0.1) as board:
            kind, page = _get(board.url)
            assert kind.startswith("text/html") and b"static/dashboard.js" in page
            for path in ("static/dashboard.js", "static/vendor/uPlot.iife.min.js", "static/vendor/uPlot.min.css"):
                assert len(_get(board.url + path)[1]) > 1000
            kind, body = _get(board.url + "api/snapshot")
            assert kind.startswith("application/json") and json.loads(body)["model"] == eng.model_name
            with urllib.request.urlopen(board.url + "api/events", timeout=30) as r:
                assert r.headers["content-type"].startswith("text/event-stream")
                first = [r.readline() for _ in range(3)]
                assert first[0] == b"event: snapshot\n" and b"history" in first[1]
                second = [r.readline() for _ in range(3)]
                assert b'"point"' in second[1] and b'"history"' not in second[1]
            with socket.socket() as s:  # the port is taken: a typed error saying what to do
                s.bind(("127.0.0.1", 0))
                s.listen(1)
                with pytest.raises(ConfigError, match="in use.*port=0"):
                    dashboard.serve(rt, port=s.getsockname()[1])

    _two_agents(check)


def test_bad_arguments_are_typed_errors():
    with pytest.raises(ConfigError, match="Engine or Runtime"):
        Dashboard(object())
    with pytest.raises(ConfigError, match="interval"):
        Dashboard(None, interval=0)
    with pytest.raises(ConfigError, match="turns"):
        Dashboard(None, turns=0)
    with pytest.raises(ConfigError, match="port"):
        dashboard.serve(None, port=70000)


def test_agentrt_serve_dashboard_mounts_the_page():
    from agentrt.cli import main
    from agentrt.server import ServerConfig, ServerThread

    with ServerThread(tiny_native_with_tokenizer(), ServerConfig(port=0, dashboard=True, model_name="m")) as server:
        kind, page = _get(server.base_url + "/dashboard")  # (redirected to /dashboard/)
        assert kind.startswith("text/html") and b"agentrt dashboard" in page
        snap = json.loads(_get(server.base_url + "/dashboard/api/snapshot")[1])
        assert snap["stats"]["pages_total"] > 0 and snap["agents"] == [] and snap["turns"] == []
        assert len(_get(server.base_url + "/dashboard/static/dashboard.js")[1]) > 1000
        for user in ("alice", "bob"):  # a request through the API is a turn on the timeline
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                               "user": user}).encode()
            req = urllib.request.Request(server.base_url + "/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                assert json.loads(resp.read())["usage"]["completion_tokens"] > 0
        for _ in range(50):  # (a snapshot is kept for half the sampling interval)
            turns = json.loads(_get(server.base_url + "/dashboard/api/snapshot")[1])["turns"]
            if turns:
                break
            time.sleep(0.1)
        assert len(turns) == 2 and all(t["completion_tokens"] > 0 for t in turns)
        assert {s[0] for t in turns for s in t["segments"]} >= {"prefill", "decode"}
    with pytest.raises(ConfigError, match="replicas"):
        ServerConfig(dashboard=True, replicas=2)
    assert main(["dashboard", "--agents", "0"]) == 2  # (refused before any model is loaded)
