"""Resume after a restart (issue 59): an agent by its stable name, a LangGraph thread over its
checkpointer, on a new engine over the same state dir, get their KV back from disk and compute
only their new tokens; and the answer is the one a process that never restarted gives."""

from __future__ import annotations

import pytest

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams
from tests.conftest import tiny_native_with_tokenizer

pytestmark = pytest.mark.anyio


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def _agent() -> Agent:
    return Agent("calc", "You add numbers with the add tool. " * 20, [add], tool_choice="required",
                 settings=SamplingParams(max_tokens=48, temperature=0.0), max_tool_rounds=1)


async def _turns(cfg: EngineConfig, questions: list[str]):
    """Each question a turn of agent `calc` on a fresh engine and runtime; returns its results
    and the engine's stats."""
    async with Engine(tiny_native_with_tokenizer(), cfg) as eng:
        async with Runtime(eng) as rt:
            ref = await rt.spawn(_agent())
            results = [await ref.ask(q) for q in questions]
        return results, eng.stats(), eng


async def test_an_agent_resumes_by_name_with_its_kv(tmp_path):
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), response_cache_size=0)
    first, _, eng = await _turns(cfg, ["What is 2 plus 3?", "And 4 plus 5?"])
    eng.core.disk.flush()
    resumed, st, _ = await _turns(cfg, ["And 6 plus 7?"])  # a new engine and runtime: a restart
    # the same turn in a process that never restarted
    unbroken, _, _ = await _turns(EngineConfig(kv_cache_tokens=8192, response_cache_size=0),
                                  ["What is 2 plus 3?", "And 4 plus 5?", "And 6 plus 7?"])
    assert resumed[-1].messages == unbroken[-1].messages
    usage, kept = resumed[-1].usage[0], unbroken[-1].usage[0]
    assert usage.prompt_tokens == kept.prompt_tokens
    # the history came from disk: the turn computes what the unbroken process computes (the new
    # message, and the tool call's re-spelled ids), within a page
    assert st.prompt_restored > 0.5 * usage.prompt_tokens
    assert usage.computed_prompt_tokens <= kept.computed_prompt_tokens + 16


async def test_a_runtime_restarted_without_state_starts_over(tmp_path):
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), response_cache_size=0)
    await _turns(cfg, ["What is 2 plus 3?"])
    fresh, st, _ = await _turns(EngineConfig(kv_cache_tokens=8192, response_cache_size=0), ["And 6 plus 7?"])
    assert st.prompt_restored == 0 and fresh[-1].messages[0]["role"] == "assistant"


async def test_a_langgraph_thread_resumes_over_its_checkpointer_with_its_kv(tmp_path):
    pytest.importorskip("langgraph")
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from agentrt.integrations.langgraph import ChatAgentrt

    saver = InMemorySaver()  # (the app's checkpointer outlives the engine: its messages come back)
    cfg = EngineConfig(kv_cache_tokens=8192, state_dir=str(tmp_path), response_cache_size=0)
    thread = {"configurable": {"thread_id": "t1"}}

    async def run(question: str, config: EngineConfig):
        async with Engine(tiny_native_with_tokenizer(), config) as eng:
            model = ChatAgentrt(engine=eng, max_tokens=8, temperature=0.0)

            async def call(state: MessagesState):
                return {"messages": [await model.ainvoke(state["messages"])]}
            g = StateGraph(MessagesState)
            g.add_node("chat", call)
            g.add_edge(START, "chat")
            app = g.compile(checkpointer=saver)
            out = await app.ainvoke({"messages": [HumanMessage(question)]}, thread)
            if eng.core.disk is not None:
                eng.core.disk.flush()
            return out["messages"][-1], eng.stats()

    long_q = "Tell me about the sea. " * 60
    await run(long_q, cfg)
    reply, st = await run("And the sky?", cfg)  # a restarted app over the same checkpointer
    usage = reply.usage_metadata
    assert st.prompt_restored > 0.8 * usage["input_tokens"]
    assert usage["input_token_details"]["cache_read"] >= st.prompt_restored
