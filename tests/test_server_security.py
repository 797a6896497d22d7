"""`agentrt serve` against hostile and careless clients (tiny model: fast): malformed bodies are
4xx naming the field, a bug is a 500 carrying a request id, and tenants (API keys, cache salts)
never see each other's cached prompts.

Oracles: the status and `param` each probe of bench/workloads/malformed.py must get; the engine's
invariants and quiescence after the corpus; `cached_tokens` across and within keys.
"""

from __future__ import annotations

import json

import anyio
import httpx
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.server import ServerConfig, ServerThread
from bench.workloads.malformed import PROBES
from tests.conftest import tiny_native_with_tokenizer
from tests.engine_util import assert_quiescent

KEY_A, KEY_B = "tenant-a-key-0123", "tenant-b-key-4567"
ENGINE = EngineConfig(kv_cache_tokens=8192)
PROMPT = [{"role": "system", "content": "You are the support desk of a shipping company. " * 4},
          {"role": "user", "content": "Where is parcel 123-456? It left Lyon on Monday."}]


def _server() -> ServerThread:
    cfg = ServerConfig(port=0, api_keys=(KEY_A, KEY_B), model_name="tiny", max_tokens_limit=256,
                       max_request_bytes=1 << 20)
    return ServerThread(tiny_native_with_tokenizer(), cfg, ENGINE)


@pytest.fixture(scope="module")
def server():
    with _server() as s:
        yield s


def _post(server, path: str, key: str, body=None, data: bytes | None = None, **headers) -> httpx.Response:
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers}
    content = data if data is not None else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers=h, timeout=120)


def _quiet(server) -> None:
    eng = server.state.engine
    with eng._steps.lock:
        eng.core.check_invariants()
        assert_quiescent(eng.core)


@pytest.mark.parametrize("probe", PROBES, ids=[p["name"] for p in PROBES])
def test_a_client_error_is_never_reported_as_a_server_error(server, probe):
    """Symptom 1: every malformed body gets its 4xx with an OpenAI error naming the field (a
    dangling $ref and `"tool_calls": 5` were 500s); the server stays up and holds nothing."""
    r = _post(server, probe["path"], KEY_A, probe.get("body"), probe.get("raw"))
    err = r.json()["error"]
    assert r.status_code == probe["status"], (r.status_code, err)
    assert err["message"] and err["type"] == "invalid_request_error"
    if probe["param"] is not None:
        assert err["param"] == probe["param"], err
    assert r.headers["x-request-id"]
    ok = _post(server, "/chat/completions", KEY_A, {"messages": PROMPT[1:], "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    _quiet(server)


def test_a_schema_the_grammar_cannot_compile_is_a_400_naming_the_tool_and_feature(server):
    tools = [{"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "lookup", "parameters": {
                 "type": "object", "properties": {"id": {"$ref": "#/$defs/missing"}}}}}]
    r = _post(server, "/chat/completions", KEY_A, {"messages": PROMPT, "tools": tools, "tool_choice": "required"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "tools.1.function.parameters", err
    assert "'lookup'" in err["message"] and "$ref at /properties/id/$ref" in err["message"], err
    assert err["code"] == "unsupported_schema"


def test_a_bug_is_a_500_with_a_request_id_and_no_traceback(server, monkeypatch, caplog):
    from agentrt.server.openai import chat

    def broken(*a, **k):
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(chat, "prepare", broken)
    r = _post(server, "/chat/completions", KEY_A, {"messages": PROMPT}, **{"X-Request-Id": "probe-42"})
    err = r.json()["error"]
    assert r.status_code == 500 and err["type"] == "server_error", err
    assert "probe-42" in err["message"] and "secret" not in r.text and "Traceback" not in r.text
    assert r.headers["x-request-id"] == "probe-42"
    assert any("probe-42" in rec.getMessage() and rec.exc_info for rec in caplog.records)
    r = _post(server, "/chat/completions", KEY_A, {"messages": PROMPT}, **{"X-Request-Id": "bad id;" * 20})
    assert r.status_code == 500 and r.headers["x-request-id"].startswith("req-")  # a made-up id replaced


def _cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_one_tenant_cannot_see_another_tenants_prompts():
    """Symptom 2: key B sending key A's prompt under A's prompt_cache_key was told cached_tokens =
    the whole prompt. The prefix cache, the response cache and the sessions are per key now."""
    with _server() as server:
        _tenants(server)


def _tenants(server) -> None:
    body = {"messages": PROMPT, "max_tokens": 4, "temperature": 0, "prompt_cache_key": "thread-1"}
    assert _cached(_post(server, "/chat/completions", KEY_A, body)) == 0
    again = _post(server, "/chat/completions", KEY_A, body)
    assert _cached(again) >= again.json()["usage"]["prompt_tokens"] - 4  # reuse within a key, unchanged
    assert _cached(_post(server, "/chat/completions", KEY_B, body)) == 0
    assert _cached(_post(server, "/chat/completions", KEY_B, body)) > 0  # B's own reuse
    # transient requests (no session), under one client-side cache_salt: a fresh namespace per key
    transient = {"messages": PROMPT, "max_tokens": 4, "temperature": 0, "cache_salt": "user-7"}
    assert _cached(_post(server, "/chat/completions", KEY_A, transient)) == 0
    assert _cached(_post(server, "/chat/completions", KEY_A, transient)) > 0  # radix + response cache, same key
    assert _cached(_post(server, "/chat/completions", KEY_B, transient)) == 0
    assert _cached(_post(server, "/chat/completions", KEY_A, {**transient, "cache_salt": "user-8"})) == 0
    text = {"prompt": "Tracking numbers are eleven digits long, " * 6, "max_tokens": 2, "temperature": 0}
    assert _cached(_post(server, "/completions", KEY_A, text)) == 0
    assert _cached(_post(server, "/completions", KEY_A, text)) > 0
    assert _cached(_post(server, "/completions", KEY_B, text)) == 0
    _quiet(server)


def test_cache_salt_isolates_in_process(anyio_backend):
    prompt = list(range(10, 90))
    params = SamplingParams(max_tokens=2, temperature=0)

    async def main():
        async with Engine(tiny_native_with_tokenizer(), ENGINE) as eng:
            first = await eng.complete(prompt, params, cache_salt="a")
            other = await eng.complete(prompt, params, cache_salt="b")
            unsalted = await eng.complete(prompt, params)
            same = await eng.complete(prompt, params, cache_salt="a")
            async with await eng.open_session(cache_salt="b") as s:
                in_session = await eng.complete(prompt, params, session=s)
            assert eng.cached_prefix_len(prompt, cache_salt="c") == 0
            return first, other, unsalted, same, in_session

    first, other, unsalted, same, in_session = anyio.run(main)
    assert first.usage.cached_tokens == other.usage.cached_tokens == unsalted.usage.cached_tokens == 0
    assert same.usage.cached_tokens > 0 and in_session.usage.cached_tokens > 0
    assert same.token_ids == first.token_ids == other.token_ids


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/completions", {"prompt": "hi", "max_tokens": 2}),
    ("/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})])
def test_a_model_the_server_does_not_serve_is_a_404_naming_the_served_one(server, path, body):
    """vLLM and Ollama answer 404 for a model they do not serve; so do we, in each protocol's own
    error shape (issue 57: "gpt-4o" was answered by the tiny model)."""
    r = _post(server, path, KEY_A, {**body, "model": "gpt-4o"})
    assert r.status_code == 404, r.text
    if path == "/messages":
        err = r.json()["error"]
        assert r.json()["type"] == "error" and err["type"] == "not_found_error"
    else:
        err = r.json()["error"]
        assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "'gpt-4o'" in err["message"] and "'tiny'" in err["message"]
    ok = _post(server, path, KEY_A, {**body, "model": "tiny"})
    assert ok.status_code == 200, ok.text
    _quiet(server)


def test_any_model_answers_whatever_name_a_client_sends():
    cfg = ServerConfig(port=0, model_name="tiny", any_model=True)
    with ServerThread(tiny_native_with_tokenizer(), cfg, ENGINE) as s:
        r = httpx.post(f"{s.url}/chat/completions", timeout=120, json={
            "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "tiny"
