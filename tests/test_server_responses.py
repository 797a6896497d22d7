"""The Responses API (`/v1/responses`) against the official `openai` client (loopback, embedded
model).

Oracles: chat completions on the same conversation (same greedy tokens; the chain computes what
the `prompt_cache_key` path computes: only the new input), `json.loads` + the tool's schema for
call arguments, streamed == non-streamed, and 404s for ids the caller does not own.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from agentrt import EngineConfig
from agentrt.server import ServerConfig, ServerThread

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

KEY, OTHER = "resp-key-0123", "resp-key-4567"
ENGINE = EngineConfig(kv_cache_tokens=16384)
QUESTIONS = ["Hi! What is the capital of France?", "And of Italy?", "And of Spain?", "What about Germany?",
             "And Japan?", "Thanks! And Portugal?"]
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.", "parameters": PARAMS}


@pytest.fixture(scope="module")
def server(embedded_native):
    cfg = ServerConfig(port=0, api_keys=(KEY, OTHER), model_name="smol", max_tokens_limit=512)
    with ServerThread(embedded_native, cfg, ENGINE) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key=KEY, max_retries=0)


def _computed(r) -> int:
    return r.usage.model_extra["agentrt"]["computed_input_tokens"]


def test_a_chain_of_six_turns_computes_only_the_new_input(embedded_native):
    """previous_response_id continues on the chain's KV session: each turn computes exactly what
    chat completions computes when the client resends the history under a prompt_cache_key (the
    new user message and the turn's framing), and the replies are token-identical."""
    with ServerThread(embedded_native, ServerConfig(port=0, model_name="smol"), ENGINE) as s:
        c = openai.OpenAI(base_url=s.url, api_key="none-0000", max_retries=0)
        chain, prev = [], None
        for q in QUESTIONS:
            r = c.responses.create(model="smol", input=q, previous_response_id=prev, max_output_tokens=24,
                                   temperature=0)
            chain.append((r.output_text, r.usage.input_tokens, _computed(r)))
            prev = r.id
    with ServerThread(embedded_native, ServerConfig(port=0, model_name="smol"), ENGINE) as s:
        c = openai.OpenAI(base_url=s.url, api_key="none-0000", max_retries=0)
        msgs, resent = [], []
        for q in QUESTIONS:
            msgs.append({"role": "user", "content": q})
            r = c.chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=24,
                                          extra_body={"prompt_cache_key": "conv"})
            msgs.append({"role": "assistant", "content": r.choices[0].message.content})
            u = r.usage
            resent.append((r.choices[0].message.content, u.prompt_tokens, u.prompt_tokens - u.prompt_tokens_details.cached_tokens))
    assert chain == resent
    assert all(computed <= 20 for _, _, computed in chain[1:])  # only the new message and its framing


def test_text_tools_and_a_function_call_output_round_trip(client):
    r = client.responses.create(model="smol", input="What is the weather in Paris today?", tools=[WEATHER],
                                tool_choice="required", temperature=0)
    call = r.output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    assert r.status == "completed" and r.usage.input_tokens > 0
    follow = client.responses.create(model="smol", previous_response_id=r.id, tools=[WEATHER], temperature=0,
                                     max_output_tokens=30, input=[{"type": "function_call_output",
                                                                   "call_id": call.call_id, "output": "18C, sunny"}])
    assert follow.previous_response_id == r.id and follow.output_text
    assert "tool_response>" not in follow.output_text  # (issue 57: no template markup in an answer)
    # the tool result and the call's re-spelt tags (the canonical re-tokenization of issue 33), not the history
    assert _computed(follow) < 0.25 * follow.usage.input_tokens, follow.usage


def test_streamed_events_assemble_to_the_plain_response(client):
    kw = dict(model="smol", input="What is the weather in Tokyo?", tools=[WEATHER], tool_choice="required",
              temperature=0)
    plain = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == args == plain.output[-1].arguments
    final = events[-1].response
    assert [o.model_dump() for o in final.output] == [o.model_dump() for o in plain.output]
    assert final.usage.input_tokens == plain.usage.input_tokens
    text = client.responses.create(model="smol", input="Say hello.", max_output_tokens=12, temperature=0, stream=True)
    deltas, completed = [], None
    for e in text:
        deltas += [e.delta] if e.type == "response.output_text.delta" else []
        completed = e.response if e.type in ("response.completed", "response.incomplete") else completed
    assert "".join(deltas) == completed.output_text and completed.output_text


def test_json_schema_text_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.responses.create(model="smol", input="Name a city and its country as JSON.", temperature=0,
                                max_output_tokens=60, text={"format": {"type": "json_schema", "name": "place",
                                                                       "schema": schema}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_text_format_with_tools_calls_or_answers_in_the_schema(client):
    """`text.format` json_schema beside `tools`: one grammar takes the calls or an answer in the
    schema. tool_choice "required" gets a valid call; in auto, whichever the model picks is valid."""
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
              "additionalProperties": False}
    fmt = {"format": {"type": "json_schema", "name": "reply", "schema": schema}}
    r = client.responses.create(model="smol", input="What is the weather in Paris?", tools=[WEATHER], text=fmt,
                                tool_choice="required", temperature=0, max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), PARAMS)
    for ask in ("What is the weather in Paris?", "Say hello to Ann."):
        r = client.responses.create(model="smol", input=ask, tools=[WEATHER], text=fmt, temperature=0,
                                    max_output_tokens=64)
        calls = [o for o in r.output if o.type == "function_call"]
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), PARAMS)
        if not calls:
            jsonschema.validate(json.loads(r.output_text), schema)


def test_stored_responses_are_the_callers_own(server, client):
    r = client.responses.create(model="smol", input="Say hi.", max_output_tokens=4, temperature=0)
    assert client.responses.retrieve(r.id).id == r.id
    other = openai.OpenAI(base_url=server.url, api_key=OTHER, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)  # another API key's response does not exist for it
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="smol", input="And?", previous_response_id=r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="smol", input="And?", previous_response_id="resp_unknown")
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="smol", input="Say hi.", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0.type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input.0"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": []}, "input"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "strin"}}}},
     "text.format"),
])
def test_bad_responses_requests_are_400s_naming_the_field(server, body, param):
    r = httpx.post(f"{server.url}/responses", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param, err


def _agent_reply(prompt: str) -> str:
    """What a good model writes for the Agents SDK test: the call, then the tool's result."""
    from agentrt.toolcall.formats import HERMES
    from tests.scripted_model import last_user

    asked = last_user(prompt)
    if asked.startswith("<tool_response>"):  # (SmolLM2's template: a tool result is a user turn)
        return asked.split("\n")[1]
    return HERMES.render_calls([("get_weather", {"city": asked.rstrip("?").split()[-1]})])


@pytest.fixture(params=["scripted", pytest.param("embedded", marks=pytest.mark.model_quality)])
def agent_server(request):
    """A server on scripted replies (the SDK, protocol and chaining are checked) or on the embedded
    model (whether the 135M model asks for the right cities and answers with the result)."""
    from tests.scripted_model import scripted

    lm = scripted(_agent_reply) if request.param == "scripted" else request.getfixturevalue("embedded_native")
    with ServerThread(lm, ServerConfig(port=0, api_keys=(KEY,), model_name="smol"), ENGINE) as s:
        yield s


def test_the_openai_agents_sdk_runs_a_tool_agent_over_responses(agent_server):
    """The OpenAI Agents SDK (its Responses model, streamed) against the server: the tool runs with
    the right argument, the answer follows, and a second run continues by previous_response_id."""
    agents = pytest.importorskip("agents")
    import anyio

    server = agent_server

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"In {city} it is 18 C and cloudy."

    async def main():
        agents.set_tracing_disabled(True)
        client = openai.AsyncOpenAI(base_url=server.url, api_key=KEY, max_retries=0)
        agent = agents.Agent(
            name="weather", instructions="Look the weather up with get_weather, then answer in one sentence.",
            tools=[get_weather], model=agents.OpenAIResponsesModel(model="smol", openai_client=client),
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=60,
                                                parallel_tool_calls=False))
        first = await agents.Runner.run(agent, "What is the weather in Paris?")
        second = await agents.Runner.run(agent, "And in Tokyo?", previous_response_id=first.last_response_id)
        return first, second

    first, second = anyio.run(main)
    assert calls == ["Paris", "Tokyo"]
    assert "18 C" in first.final_output and "Tokyo" in second.final_output


def test_a_thinking_models_reasoning_is_an_output_item_of_its_own():
    """A model that thinks (its reply opens with a <think> block; here a scripted one: the engine
    runs on the simulator's executor, which emits the script as its tokens): the reasoning is a
    `reasoning` item before the message, streamed as reasoning_text events; the message holds only
    the answer, and the chain continues with reasoning items sent back (dropped) as well."""
    from agentrt import Engine
    from agentrt.sim import ScriptBook, SimExecutor, SimModel, StepCosts
    from tests.conftest import smol_tokenizer, tiny_native_with_tokenizer

    tok = smol_tokenizer()

    class Thinking(ScriptBook):
        def output(self, prompt, max_tokens):
            return (*tok.encode("<think>\nThe user greets me.\n</think>\nHello!"), tok.eos_token_ids[0])

    model = SimModel(tiny_native_with_tokenizer().model.cfg)
    costs = StepCosts("toy", base_s=1e-3, per_seq_s=1e-4, per_token_s=1e-5, per_pair_s=1e-9, per_key_s=1e-8,
                      tier_copy_s_per_page=1e-5)
    engine = Engine(model, ENGINE, executor=SimExecutor(model, costs, Thinking()), tokenizer=tok)
    with ServerThread(engine, ServerConfig(port=0, model_name="m")) as s:
        c = openai.OpenAI(base_url=s.url, api_key="none-0000", max_retries=0)
        r = c.responses.create(model="m", input="Hi!", max_output_tokens=40)
        events = list(c.responses.create(model="m", input="Hi!", max_output_tokens=40, stream=True))
        again = c.responses.create(model="m", previous_response_id=r.id, max_output_tokens=40,
                                   input=[*[o.model_dump(exclude_none=True) for o in r.output if o.type == "reasoning"],
                                          {"role": "user", "content": "Hi again!"}])
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.output[0].content[0].text == "\nThe user greets me.\n" and r.output_text == "Hello!"
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == r.output[0].content[0].text
    assert [o.model_dump(exclude={"id"}) for o in events[-1].response.output] == \
        [o.model_dump(exclude={"id"}) for o in r.output]  # (item ids are per response)
    assert again.output_text == "Hello!" and again.usage.input_tokens_details.cached_tokens > 0
