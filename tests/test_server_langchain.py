"""LangChain's `ChatOpenAI` with `bind_tools` in a LangGraph ToolNode graph, served by `agentrt
serve` over loopback: the calls reach the tools with the right arguments, the conversation's
session is reused across turns (prompt_cache_key), and streamed calls equal invoked ones. On
scripted replies (tests/scripted_model.py: the server, the protocol and the graph are checked)
and on the embedded model, where whether the 135M model asks for the right city is
`model_quality`."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool as lc_tool

from agentrt import EngineConfig
from agentrt.server import ServerConfig, ServerThread
from agentrt.toolcall.formats import HERMES
from tests.scripted_model import last_user, scripted

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

RAN: list[str] = []
SYSTEM = ("You are the travel desk assistant. Always look the weather up with the get_weather tool before "
          "answering; never guess. Answer in one short sentence.")


@lc_tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city name, e.g. "Paris"
    """
    RAN.append(city)
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


def reply(prompt: str) -> str:
    """What a good model writes: the call of the question's city, then an answer from its result."""
    asked = last_user(prompt)
    if asked.startswith("<tool_response>"):  # (SmolLM2's template: a tool result is a user turn)
        return "It is 18 °C and cloudy."
    return HERMES.render_calls([("get_weather", {"city": asked.split(" in ")[-1].split()[0]})])


@pytest.fixture(params=["scripted", pytest.param("embedded", marks=pytest.mark.model_quality)])
def lm(request):
    return scripted(reply) if request.param == "scripted" else request.getfixturevalue("embedded_native")


def _graph(url: str, thread: str, responses: bool = False):
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    model = ChatOpenAI(base_url=url, api_key="unused-key-00", model="smol", temperature=0, max_tokens=40,
                       max_retries=0, extra_body={"prompt_cache_key": thread}, use_responses_api=responses)
    call = model.bind_tools([get_weather], tool_choice="required", parallel_tool_calls=False)
    answer = model.bind_tools([get_weather], tool_choice="none")

    def agent(state):
        m = answer if isinstance(state["messages"][-1], ToolMessage) else call
        return {"messages": [m.invoke([SystemMessage(SYSTEM)] + state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([get_weather]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


@pytest.mark.parametrize("responses", [False, True], ids=["chat_completions", "responses_api"])
def test_chatopenai_tool_graph_over_http(lm, responses):
    """Both of ChatOpenAI's APIs: chat completions, and the Responses API (use_responses_api)."""
    RAN.clear()
    with ServerThread(lm, ServerConfig(port=0, model_name="smol"), EngineConfig(kv_cache_tokens=16384)) as s:
        app = _graph(s.url, "thread-1", responses)
        messages: list = []
        for city in ("Paris", "Tokyo"):
            out = app.invoke({"messages": messages + [HumanMessage(f"What is the weather in {city} today?")]})
            messages = out["messages"]
            new = messages[-4:]
            assert isinstance(new[1], AIMessage) and isinstance(new[2], ToolMessage) and isinstance(new[3], AIMessage)
            assert new[1].tool_calls[0]["name"] == "get_weather" and new[1].tool_calls[0]["args"] == {"city": city}
            assert new[3].content and "18" in new[2].content
        second = messages[-3]
        usage = second.usage_metadata
        assert usage["input_token_details"]["cache_read"] >= 0.8 * usage["input_tokens"], usage
        chunks = None
        from langchain_openai import ChatOpenAI

        model = ChatOpenAI(base_url=s.url, api_key="unused-key-00", model="smol", temperature=0, max_tokens=40,
                           max_retries=0, use_responses_api=responses).bind_tools([get_weather], tool_choice="required")
        prompt = [SystemMessage(SYSTEM), HumanMessage("What is the weather in Oslo today?")]
        for c in model.stream(prompt):
            chunks = c if chunks is None else chunks + c
        invoked = model.invoke(prompt)
        assert [(c["name"], c["args"]) for c in chunks.tool_calls] == [(c["name"], c["args"]) for c in invoked.tool_calls]
        assert invoked.tool_calls[0]["args"] == {"city": "Oslo"}
    assert RAN == ["Paris", "Tokyo"]
