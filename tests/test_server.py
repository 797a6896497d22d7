"""The OpenAI-compatible server against the official `openai` client (loopback, embedded model).

Oracles: the in-process conversation core on a fresh engine (same messages -> the same tokens,
text and calls), `json.loads` + `jsonschema` for tool arguments and JSON output, streamed ==
non-streamed, and the engine's invariants after a client disconnects mid-stream.
"""

from __future__ import annotations

import json
import time

import anyio
import httpx
import jsonschema
import openai
import pytest

from agentrt import Engine, EngineConfig, SamplingParams
from agentrt.conversation.conversation import Conversation, RoundEnd
from agentrt.server import ServerConfig, ServerThread
from tests.engine_util import assert_quiescent

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

KEY = "test-key-0123"
ENGINE = EngineConfig(kv_cache_tokens=16384)
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris today?"}]


@pytest.fixture(scope="module")
def server(embedded_native):
    cfg = ServerConfig(port=0, api_keys=(KEY,), model_name="smol", max_tokens_limit=512, max_request_bytes=1 << 20)
    with ServerThread(embedded_native, cfg, ENGINE) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def _in_process(lm, turns, **round_kw):
    """Replies of the conversation core on a fresh engine: one session, messages appended as
    the client sends them (the oracle for the server's routed sessions)."""
    async def main():
        out = []
        async with Engine(lm, ENGINE) as eng, await eng.open_session() as sess:
            conv = Conversation(eng, tools=round_kw.pop("tools", None), session=sess)
            for msgs, params in turns:
                conv.append(msgs)
                end = None
                async for ev in conv.round(params, **round_kw):
                    end = ev if isinstance(ev, RoundEnd) else end
                out.append(end)
        return out
    return anyio.run(main)


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["smol"]
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{server.base_url}/metrics").text
    for name in ("agentrt_requests_total", "agentrt_cache_hit_rate", "agentrt_queue_depth",
                 "agentrt_engine_step_seconds_total", "agentrt_routed_sessions"):
        assert name in text


def test_plain_and_streamed_chat_match(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Hi! What is the capital of France?"}],
              temperature=0, max_tokens=24)
    r = client.chat.completions.create(**kw)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens


@pytest.mark.model_quality
def test_the_capital_of_france_is_paris(client):
    """The 135M model's answer (the API around it: test_plain_and_streamed_chat_match)."""
    r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi! What is the capital "
                                       "of France?"}], temperature=0, max_tokens=24)
    assert "Paris" in r.choices[0].message.content


def _one_call(client, choice):
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice,
                                       temperature=0, max_tokens=48, parallel_tool_calls=False)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1
    return msg.tool_calls[0]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_calls_required_and_named(client, choice):
    """One call of an offered tool (the named one when named), its arguments in its schema."""
    call = _one_call(client, choice)
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    assert call.function.name in (tools if choice == "required" else ["get_weather"])
    jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])
    assert call.id.startswith("call_")


@pytest.mark.model_quality
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_weather_question_calls_get_weather_for_paris(client, choice):
    call = _one_call(client, choice)
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})


def test_streamed_tool_call_fragments_assemble_to_the_same_calls(client):
    kw = dict(model="smol", messages=[{"role": "user", "content": "Weather in Paris and in Tokyo?"}],
              tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=96)
    r = client.chat.completions.create(**kw)
    calls: dict[int, dict] = {}
    fragments = 0
    for c in client.chat.completions.create(**kw, stream=True):
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            slot = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                slot["id"], slot["name"] = tc.id, tc.function.name
            if tc.function and tc.function.arguments:
                slot["arguments"] += tc.function.arguments
                fragments += 1
    got = [(calls[i]["id"], calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    want = [(t.id, t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls]
    assert got == want and len(want) >= 1
    assert fragments > len(want)  # arguments arrive in pieces, not once per call
    for _, name, args in got:
        assert name in ("get_weather", "get_time")
        jsonschema.validate(args, WEATHER["function"]["parameters"])


def test_auto_tool_choice_matches_the_in_process_core(client, embedded_native):
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48,
                                       extra_body={"return_token_ids": True})
    [end] = _in_process(embedded_native, [(ASK, SamplingParams(max_tokens=48))], tools=[WEATHER])
    assert r.choices[0].token_ids == end.generated
    got = [(t.function.name, json.loads(t.function.arguments)) for t in r.choices[0].message.tool_calls or []]
    assert got == [(c.name, c.arguments) for c in end.calls]


def test_json_schema_output(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "Name the capital of France and its country as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}},
        temperature=0, max_tokens=64)
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(model="smol", messages=ASK, response_format={"type": "json_object"},
                                       temperature=0, max_tokens=64)
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_six_turns_with_prompt_cache_key_reuse_the_session(embedded_native):
    # a fresh server: its radix cache holds nothing from other tests, as the fresh in-process engine
    with ServerThread(embedded_native, ServerConfig(port=0, model_name="smol"), ENGINE) as s:
        replies, cached = _six_turns(openai.OpenAI(base_url=s.url, api_key="none-0000", max_retries=0))
    assert all(b[0] > a[0] for a, b in zip(cached, cached[1:]))  # cached_tokens grows every turn
    assert all(c >= p - 24 for c, p in cached[1:])  # only the new user message is prefilled
    turns = [([{"role": "user", "content": q}], SamplingParams(max_tokens=24)) for q in QUESTIONS]
    ends = _in_process(embedded_native, turns)
    assert replies == [e.generated for e in ends]


QUESTIONS = ["Hi! What is the capital of France?", "And of Italy?", "And of Spain?", "What about Germany?",
                 "And Japan?", "Thanks! And Portugal?"]


def _six_turns(client):
    msgs, replies, cached = [], [], []
    for q in QUESTIONS:
        msgs.append({"role": "user", "content": q})
        r = client.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24,
                                           extra_body={"prompt_cache_key": "conv-1", "return_token_ids": True})
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        replies.append(r.choices[0].token_ids)
        cached.append((r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens))
    return replies, cached


def test_completions_plain_and_streamed(client):
    r = client.completions.create(model="smol", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.choices[0].text and r.usage.prompt_tokens > 0
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="smol", prompt="The capital of France is", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert text == r.choices[0].text
    r = client.completions.create(model="smol", prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=[" 6"])
    assert " 6" not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_penalties_and_vllms_sampling_extensions_reach_the_engine(client):
    ask = dict(model="smol", prompt="1, 1, 1, 1, 1, 1,", max_tokens=12, temperature=0)
    plain = client.completions.create(**ask).choices[0].text
    penalized = client.completions.create(**ask, frequency_penalty=2.0, presence_penalty=1.0).choices[0].text
    assert penalized != plain  # (greedy: the penalties alone changed the text)
    again = client.completions.create(**ask, frequency_penalty=2.0, presence_penalty=1.0).choices[0].text
    assert again == penalized
    r = client.completions.create(**{**ask, "temperature": 0.8, "seed": 3},
                                  extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.2})
    assert r.choices[0].text


@pytest.mark.parametrize("kw, param", [
    ({"n": 2}, "n"), ({"temperature": 5.0}, "temperature"), ({"max_tokens": 100000}, "max_tokens"),
    ({"messages": []}, "messages"), ({"tool_choice": "required"}, "tool_choice"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ({"response_format": {"type": "xml"}}, "response_format.type"), ({"logprobs": True}, "logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty")])
def test_bad_requests_are_openai_400s(client, kw, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**{"model": "smol", "messages": ASK, "max_tokens": 8, **kw})
    err = info.value.body
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_auth_size_route_and_body_errors(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url, api_key="wrong-key-000", max_retries=0).models.list()
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    url = f"{server.url}/chat/completions"
    r = httpx.post(url, content=b"{not json", headers=h)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url, content=b"x" * (2 << 20), headers=h)
    assert r.status_code == 413 and r.json()["error"]["message"]
    r = httpx.get(f"{server.url}/nothing-here", headers=h)
    assert r.status_code == 404 and "error" in r.json()


def test_disconnect_mid_stream_frees_the_request(server):
    body = {"model": "smol", "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}],
            "max_tokens": 400, "temperature": 0, "stream": True, "prompt_cache_key": "gone", "ignore_eos": True}
    eng = server.state.engine
    before = eng.stats().decode_tokens
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert all(line.startswith("data: ") or line == "" for line in got)
    deadline = time.monotonic() + 20
    while eng.stats().running + eng.stats().waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    st = eng.stats()
    assert st.running == 0 and st.waiting == 0
    assert st.decode_tokens - before < 200  # cancelled at the disconnect, not run to max_tokens=400
    assert not server.state.router.sessions[f"{_caller()}:gone"].lock.locked()
    with eng._steps.lock:
        eng.core.check_invariants()
        assert_quiescent(eng.core)


def _caller() -> str:
    import hashlib

    return hashlib.sha256(KEY.encode()).hexdigest()[:12]


def test_concurrency_limit_and_idle_session_expiry(embedded_native):
    cfg = ServerConfig(port=0, max_concurrency_per_key=1, session_ttl_s=0.4)
    body = {"messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}],
            "max_tokens": 300, "temperature": 0, "stream": True, "prompt_cache_key": "held"}
    with ServerThread(embedded_native, cfg, ENGINE) as s:
        r = httpx.post(f"{s.url}/chat/completions", json={**body, "stream": False, "max_tokens": 4})
        assert r.status_code == 200 and "held" in s.state.router.sessions["anon:held"].key
        counting = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 2000, "temperature": 0, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{s.url}/completions", json=counting, timeout=60) as held:
            lines = held.iter_lines()  # (kept: a dropped line iterator closes the stream)
            assert held.status_code == 200 and next(lines).startswith("data: ")
            assert s.state.active == {"anon": 1}  # a long request holds the caller's only slot
            r = httpx.post(f"{s.url}/chat/completions", json={**body, "stream": False, "max_tokens": 4})
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error", (r.json(), s.state.active)
        deadline = time.monotonic() + 10  # (the router lets a session go, then awaits its engine session's close)
        while (s.state.router.sessions or s.state.engine.stats().sessions) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not s.state.router.sessions  # expired by its idle TTL with no request to trigger it
        assert s.state.engine.stats().sessions == 0


def test_tools_and_a_response_format_in_one_round(client):
    """`tools` with a `response_format` schema: one grammar takes the calls or an answer matching
    the schema (before, the schema's grammar dropped the tools). tool_choice "required" gets its
    call; in auto the embedded model answers these questions, in the schema."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    r = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER], response_format=fmt,
                                       tool_choice="required", temperature=0, max_tokens=64)
    calls = r.choices[0].message.tool_calls or []
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])
    for messages in (ASK, [{"role": "user", "content": "Say hello to Ann."}]):
        r = client.chat.completions.create(model="smol", messages=messages, tools=[WEATHER], response_format=fmt,
                                           temperature=0, max_tokens=64)
        if not r.choices[0].message.tool_calls:
            jsonschema.validate(json.loads(r.choices[0].message.content), schema)
