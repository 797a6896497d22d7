"""Traces across the integrations: a LangGraph run (a ChatAgentrt node and an agent node under the
caller's span, ChatAgentrt from another thread through its engine host) and the server (W3C
`traceparent` in, the request's SERVER span around its `chat` span, `traceparent` out)."""

from __future__ import annotations

from typing import Literal

import anyio
import httpx
import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("langgraph")

from langchain_core.messages import HumanMessage  # noqa: E402

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, tool, tracing  # noqa: E402
from agentrt.integrations.langgraph import ChatAgentrt, agent_node  # noqa: E402
from agentrt.integrations.langgraph.host import EngineHost  # noqa: E402
from agentrt.tracing import attributes as A  # noqa: E402
from tests.conftest import tiny_model_with_tokenizer, tiny_native_with_tokenizer  # noqa: E402
from tests.tracing_util import named, parent_of, tree  # noqa: E402

CFG = EngineConfig(kv_cache_tokens=4096)


@tool
def lookup(topic: Literal["a"]) -> str:
    """Look the topic up."""
    return "found"


def test_a_langgraph_run_is_one_tree_under_the_callers_span(spans):
    from langgraph.graph import END, START, MessagesState, StateGraph

    exporter, provider = spans

    async def main():
        async with Engine(tiny_native_with_tokenizer(), CFG) as eng, Runtime(eng) as rt:
            model = ChatAgentrt(engine=eng, max_tokens=6)

            async def draft(state):
                return {"messages": [await model.ainvoke(state["messages"])]}
            researcher = Agent("researcher", "Call lookup.", [lookup], tool_choice="required", max_tool_rounds=1,
                               settings=SamplingParams(max_tokens=48))
            g = StateGraph(MessagesState)
            g.add_node("draft", draft)
            g.add_node("researcher", agent_node(researcher, rt))
            g.add_edge(START, "draft")
            g.add_edge("draft", "researcher")
            g.add_edge("researcher", END)
            app = g.compile()
            with provider.get_tracer("test").start_as_current_span("graph"):
                await app.ainvoke({"messages": [HumanMessage("hello")]}, {"configurable": {"thread_id": "t"}})
            await model.arelease()
    anyio.run(main)
    by_id, kids = tree(exporter)
    (graph,) = named(exporter, "graph")
    (agent,) = named(exporter, "invoke_agent researcher")
    chats = named(exporter, "chat ")
    draft_chat = chats[0]  # the draft node ran first
    assert parent_of(draft_chat, by_id) is graph and parent_of(agent, by_id) is graph
    assert draft_chat.attributes[A.OUTPUT_TOKENS] <= 6 and draft_chat.attributes[A.REQUEST_MAX_TOKENS] == 6
    assert [s for s in chats if parent_of(s, by_id) is agent] == chats[1:] and len(chats) == 3
    tools = named(exporter, "execute_tool lookup")
    assert tools and all(parent_of(t, by_id) is agent for t in tools)
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {graph.context.trace_id}
    assert agent.attributes[A.TASK_ID]  # the graph run's task


def test_chat_agentrt_from_another_thread_continues_the_callers_trace(spans):
    exporter, provider = spans
    host = EngineHost.start(lambda: Engine(tiny_model_with_tokenizer(), CFG))
    try:
        model = ChatAgentrt(host=host, max_tokens=4)
        with provider.get_tracer("test").start_as_current_span("caller"):
            model.invoke([HumanMessage("hi")])
    finally:
        model.close()
    by_id, _ = tree(exporter)
    (caller,) = named(exporter, "caller")
    (chat,) = named(exporter, "chat ")
    assert parent_of(chat, by_id) is caller  # (the round ran on the host's loop, in another thread)


def test_the_server_reads_and_writes_traceparent(spans):
    from agentrt.server import ServerConfig, ServerThread

    exporter, _ = spans
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with ServerThread(tiny_model_with_tokenizer(), ServerConfig(port=0, model_name="tiny"), CFG) as s:
        given = httpx.post(f"{s.url}/chat/completions", json=body, timeout=60,
                           headers={"traceparent": f"00-{trace_id}-{parent_id}-01"})
        fresh = httpx.post(f"{s.url}/chat/completions", json=body, timeout=60)
        tracing.disable()
        off = httpx.post(f"{s.url}/chat/completions", json=body, timeout=60)
    assert given.status_code == fresh.status_code == off.status_code == 200
    assert "traceparent" not in off.headers
    by_id, _ = tree(exporter)
    servers = named(exporter, "POST /v1/chat/completions")
    assert len(servers) == 2  # (none while off)
    for response, server in zip((given, fresh), servers):
        version, tid, sid, flags = response.headers["traceparent"].split("-")
        assert (int(tid, 16), int(sid, 16)) == (server.context.trace_id, server.context.span_id)
        assert server.attributes[A.HTTP_STATUS] == 200 and server.attributes[A.HTTP_ROUTE] == "/v1/chat/completions"
        (chat,) = [c for c in named(exporter, "chat ") if parent_of(c, by_id) is server]
        assert chat.attributes[A.OPERATION] == "chat" and chat.attributes[A.OUTPUT_TOKENS] <= 4
    assert format(servers[0].context.trace_id, "032x") == trace_id  # the client's trace, continued
    assert format(servers[0].parent.span_id, "016x") == parent_id and servers[0].parent.is_remote
    assert servers[1].parent is None and format(servers[1].context.trace_id, "032x") != trace_id
