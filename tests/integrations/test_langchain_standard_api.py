"""ChatAgentrt's API where LangChain's standard suite found defects.

Siblings of the standard tests (same call shapes), plus what the suite does not check:
constructor arguments refused or honoured (stop, timeout, max_retries), strict, repeated calls
ending a reply, and the finish reason of a truncated reply. They run on scripted replies
(tests/scripted_model.py: what is checked is the API's part, whatever a model would answer),
except the timeout test (it needs a model that takes time) and the agent loop under a forced
call on the embedded model, whose arguments and answer are the 135M model's (`model_quality`).
Oracles: the schema classes themselves, `convert_to_json_schema`, the session's held tokens,
and the engine's invariants after a timed-out call.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_json_schema
from pydantic import BaseModel, Field
from pydantic import v1 as pydantic_v1

from agentrt import Engine, EngineConfig
from agentrt.errors import ConfigError, GenerationTimeout
from agentrt.integrations.langgraph import ChatAgentrt
from agentrt.integrations.langgraph import stream as stream_module
from agentrt.integrations.langgraph.host import EngineHost
from agentrt.integrations.langgraph.structured import JSON_OBJECT
from agentrt.toolcall.formats import HERMES
from tests.engine_util import assert_quiescent
from tests.scripted_model import last_user, scripted

pytestmark = [pytest.mark.embedded, pytest.mark.slow]  # (scripted replies over the embedded GGUF's tokenizer)


class Joke(BaseModel):
    setup: str = Field(description="question to set up a joke")
    punchline: str = Field(description="answer to resolve the joke")


class JokeV1(pydantic_v1.BaseModel):
    setup: str = pydantic_v1.Field(description="question to set up a joke")
    punchline: str = pydantic_v1.Field(description="answer to resolve the joke")


JOKE = {"setup": "Why did the cat sit on the computer?", "punchline": "To keep an eye on the mouse."}
COPY = ('Repeat this JSON exactly: {"setup": "Why did the cat sit on the computer?", '
        '"punchline": "To keep an eye on the mouse."}')


@tool
def magic_function(input: int) -> int:
    """Applies a magic function to an input."""
    return input + 2


@tool
def get_weather(location: str) -> str:
    """Get the weather at a location."""
    return "It's sunny."


ASK_MAGIC = "What is the value of magic_function(3)? Use the tool."
FRANCE = "Hi! What is the capital of France?"


def reply(prompt: str) -> str:
    """Scripted answers: the joke copied (as JSON, or as a call of the schema's tool when one is
    offered), magic_function(3) called over and over (as greedy decoding of a small model
    does), the capital of France in a sentence."""
    asked = last_user(prompt)
    for name in ("JokeV1", "Joke"):
        if f'"name": "{name}"' in prompt:
            return HERMES.render_calls([(name, JOKE)])
    if asked == COPY:
        return json.dumps(JOKE)
    if "magic_function(3)" in asked:
        return HERMES.render_calls([("magic_function", {"input": 3})] * 17)
    return "The capital of France is Paris." if asked == FRANCE else "Hello!"


@pytest.fixture(scope="module")
def host():
    """An engine over scripted replies."""
    h = EngineHost.start(lambda: Engine(scripted(reply), EngineConfig(kv_cache_tokens=16384)))
    yield h
    h.close()


@pytest.fixture(scope="module")
def embedded_host(embedded_native):
    h = EngineHost.start(lambda: Engine(embedded_native, EngineConfig(kv_cache_tokens=16384)))
    yield h
    h.close()


def chat(host, **kw) -> ChatAgentrt:
    return ChatAgentrt(host=host, **{"max_tokens": 100, **kw})


class _Options(BaseCallbackHandler):
    def __init__(self) -> None:
        self.options: list = []

    def on_chat_model_start(self, serialized, messages, *, options=None, **kwargs) -> None:
        self.options.append(options)


@pytest.mark.parametrize("method", ["json_schema", "json_mode", "function_calling"])
@pytest.mark.parametrize("schema", [Joke, JokeV1, Joke.model_json_schema()], ids=["pydantic", "pydantic_v1", "dict"])
def test_structured_output_every_method_and_schema_kind(host, method, schema):
    """Sibling of test_structured_output[pydantic], _pydantic_2_v1 and test_json_mode."""
    runnable = chat(host).with_structured_output(schema, method=method)
    seen = _Options()
    result = runnable.invoke(COPY, config={"callbacks": [seen]})
    want = schema(**JOKE) if isinstance(schema, type) else JOKE
    assert result == want and type(result) is type(want)
    assert [o["ls_structured_output_format"] for o in seen.options] == [
        {"kwargs": {"method": method, "strict": None}, "schema": convert_to_json_schema(schema)}]
    chunks = list(runnable.stream(COPY))
    assert chunks and chunks[-1] == want


def test_strict_binds_the_grammar_or_not(host):
    model = chat(host, constrained=True)
    free = model.bind_tools([magic_function], tool_choice="any", strict=False)
    held = chat(host, constrained=False).bind_tools([magic_function], tool_choice="any", strict=True)
    assert model._spec([HumanMessage("x")], None, free.kwargs).constrained is False
    assert model._spec([HumanMessage("x")], None, held.kwargs).constrained is True
    loose = model.with_structured_output(Joke, strict=False).first
    assert loose.kwargs["response_format"] == JSON_OBJECT  # JSON syntax only, not the schema
    exact = model.with_structured_output(Joke, strict=True).first
    assert exact.kwargs["response_format"] == Joke.model_json_schema()
    strict_tool = free.kwargs["tools"][0]["function"]
    assert strict_tool["name"] == "magic_function"
    with pytest.raises(ConfigError, match="method"):
        model.with_structured_output(Joke, method="xml")
    with pytest.raises(ConfigError, match="unsupported"):
        model.with_structured_output(Joke, tool_name="x")


@pytest.mark.embedded
@pytest.mark.model_quality
def test_agent_loop_under_required(embedded_host):
    """Sibling of test_agent_loop: the same loop with the call forced, on the embedded model
    (the arguments and the answer are the model's; on scripted replies:
    test_langchain_standard_scripted.py's test_agent_loop)."""
    host = embedded_host
    llm = chat(host).bind_tools([get_weather], tool_choice="any")
    question = HumanMessage("What is the weather in San Francisco, CA?")
    call = llm.invoke([question])
    assert any(b["type"] == "tool_call" for b in call.content_blocks)
    assert [(c["name"], c["args"]) for c in call.tool_calls] == [("get_weather", {"location": "San Francisco, CA"})]
    result = get_weather.invoke(call.tool_calls[0])
    assert isinstance(result, ToolMessage)
    answer = chat(host).bind_tools([get_weather]).invoke([question, call, result])
    assert isinstance(answer, AIMessage) and not answer.tool_calls and "sunny" in answer.text


def test_repeated_calls_end_the_reply(host):
    """Greedy decoding repeats the one call asked for; the reply ends at the repeat (the issue's
    17 calls), and the session holds the reply that ends after the first call."""
    ask = ASK_MAGIC
    config = {"configurable": {"thread_id": "repeats"}}
    model = chat(host)
    one = model.bind_tools([magic_function], tool_choice="any").invoke(ask, config)
    assert [(c["name"], c["args"]) for c in one.tool_calls] == [("magic_function", {"input": 3})]
    assert one.response_metadata["finish_reason"] == "tool_calls"
    (routed,) = model.sessions.values()
    held = model.engine.tokenizer.decode(routed.conversation.tokens)
    reply = held.rsplit("<|im_start|>assistant\n", 1)[1]
    assert reply == '<tool_call>{"name": "magic_function", "arguments": {"input": 3}}</tool_call><|im_end|>\n'
    runaway = chat(host, stop_on_repeated_call=False, max_parallel_calls=None)
    many = runaway.bind_tools([magic_function], tool_choice="any").invoke(ask)
    assert len(many.tool_calls) > 1 and {c["args"]["input"] for c in many.tool_calls} == {3}
    assert many.response_metadata["finish_reason"] == "length"  # truncated, whatever came before
    capped = chat(host, stop_on_repeated_call=False, max_parallel_calls=2)
    two = capped.bind_tools([magic_function], tool_choice="any").invoke(ask)
    assert len(two.tool_calls) == 2 and two.response_metadata["finish_reason"] == "tool_calls"


def test_truncated_call_finishes_with_length(host):
    r = chat(host, max_tokens=12).bind_tools([magic_function], tool_choice="any").invoke("magic_function(3)?")
    assert r.tool_calls == [] and len(r.invalid_tool_calls) == 1
    assert r.response_metadata["finish_reason"] == "length"


def test_constructor_arguments_are_honoured_or_refused(host):
    keyed = ChatAgentrt(host=host, api_key="sk-unused")  # as partner models take it (a remote's key)
    assert keyed.api_key.get_secret_value() == "sk-unused" and "sk-unused" not in repr(keyed)
    with pytest.raises(ConfigError, match="api_key"):
        ChatAgentrt(host=host, api_key=5)
    with pytest.raises(ConfigError, match="no_such_argument"):
        ChatAgentrt(host=host, no_such_argument=1)  # unknown arguments are still refused
    with pytest.raises(ConfigError, match="max_retries"):
        ChatAgentrt(host=host, max_retries=-1)
    with pytest.raises(ConfigError, match="timeout"):
        ChatAgentrt(host=host, timeout=0)
    ask = FRANCE
    plain = chat(host, max_tokens=24).invoke(ask).text
    assert plain == "The capital of France is Paris."
    first, word = plain.split()[0], plain.split()[2]
    cut = chat(host, max_tokens=24, stop=[word])
    assert cut.invoke(ask).text == plain[:plain.index(word)]  # the init-time stop
    assert cut._get_ls_params()["ls_stop"] == [word]
    assert cut.invoke(ask, stop=["never-written"]).text == plain  # a call's own stop replaces it
    assert cut.invoke(ask, stop=[first]).text == ""
    assert ChatAgentrt(host=host, streaming=True).streaming is True


@pytest.mark.embedded
def test_timeout_cancels_and_retries_before_the_first_token(embedded_host, monkeypatch):
    host = embedded_host
    attempts = []
    real = stream_module.routed_conversation

    def counted(*args, **kwargs):
        attempts.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(stream_module, "routed_conversation", counted)
    model = chat(host, max_tokens=400, timeout=0.001, max_retries=2)
    with pytest.raises(GenerationTimeout, match="timeout"):
        model.invoke("Write a long story about a cat.")
    assert len(attempts) == 3  # the first try and two retries
    attempts.clear()
    with pytest.raises(GenerationTimeout):
        chat(host, max_tokens=400, timeout=0.5, max_retries=2).invoke("Write a long story about a cat.")
    assert len(attempts) == 1  # the timeout came after the first chunk: no retry

    def idle(core=host.engine.core):
        core.check_invariants()
        assert_quiescent(core)
    host.portal.call(host.engine.run_in_step_thread, idle)  # nothing leaked by the cancelled calls
