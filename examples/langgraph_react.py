"""A LangGraph ReAct graph (model node + ToolNode) on ChatAgentrt, with an InMemorySaver
checkpointer, on the embedded SmolLM2-135M.

The 135M model rarely decides to call a tool on its own, so the model node asks for a call
(`tool_choice="required"`, enforced by the grammar) when a user message arrives and for an
answer (`"none"`) after tool results. What makes it pick the right tool: names that differ from
their first token (`weather` / `local_time`; with `get_weather` / `get_local_time` it calls
`get_local_time` for every question). It does not phrase an answer either: it repeats the tool's
result, so the tools return a short sentence. `--prebuilt` runs LangGraph's own
`create_react_agent` (tool_choice "auto") on the same tools: that needs a bigger model
(`--model path/to/model.gguf`); the 135M answers without calling a tool.

Each thread keeps one KV session in agentrt: LangGraph resends the whole history every call,
and only the new messages are prefilled (`cache_read` in each answer's usage shows it).
Tool calls are constrained by a grammar and validated while they stream.
    python examples/langgraph_react.py
"""

from __future__ import annotations

import re
import time

import anyio
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from agentrt import Engine, EngineConfig, load_model
from agentrt.integrations.langgraph import ChatAgentrt


@tool
def weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: the city, e.g. "Paris"
    """
    table = {"paris": (18, "cloudy"), "tokyo": (24, "sunny"), "oslo": (-3, "snowing")}
    if city.strip().lower() not in table:
        return f"No weather data for {city}."
    temp, sky = table[city.strip().lower()]
    return f"In {city} it is {temp} °C and {sky}."


@tool
def local_time(city: str) -> str:
    """Local time in a city (24h clock).

    Args:
        city: the city
    """
    clock = {"paris": "14:05", "tokyo": "21:05", "oslo": "14:05"}.get(city.strip().lower())
    return f"It is {clock} in {city}." if clock else f"No time zone data for {city}."


PROMPT = ("You are a travel assistant. Look facts up with the tools before you answer; "
          "then answer in one short sentence.")
# ChatAgentrt keeps the tool-format tags a small model echoes (`<tool_response>`) in the answer's
# content (agentrt's Agent strips them); they are removed for display only
_ECHO = re.compile(r"</?tool_(?:response|call)>")


def answer_text(content: str) -> str:
    return " ".join(_ECHO.sub(" ", content).split())


def show(messages, t0: float) -> None:
    looked_up = False
    for m in messages:
        if isinstance(m, AIMessage) and m.tool_calls:
            looked_up = True
            print(f"  [{time.perf_counter() - t0:5.1f}s] call   {m.tool_calls[0]['name']}({m.tool_calls[0]['args']})")
        elif isinstance(m, ToolMessage):
            print(f"  [{time.perf_counter() - t0:5.1f}s] result {m.text}")  # (content blocks joined)
        elif isinstance(m, AIMessage):
            u = m.usage_metadata or {}
            read = (u.get("input_token_details") or {}).get("cache_read", 0)
            print(f"  [{time.perf_counter() - t0:5.1f}s] answer {answer_text(m.content)!r}  "
                  f"(prompt {u.get('input_tokens')} tokens, {read} from KV already held)")
            if not looked_up:
                print("           (no tool was called: the model made this answer up)")


def react_graph(model, tools):
    """agent -> (tool calls?) -> tools -> agent, as create_react_agent builds it."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    call = model.bind_tools(tools, tool_choice="required")
    answer = model.bind_tools(tools, tool_choice="none")

    async def agent(state):
        m = answer if isinstance(state["messages"][-1], ToolMessage) else call
        return {"messages": [await m.ainvoke([SystemMessage(PROMPT)] + state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


async def main(prebuilt: bool, source: str) -> None:
    tools = [weather, local_time]
    lm = load_model(source)
    if prebuilt and source == "smollm2-135m":
        print("note: --prebuilt lets the model decide whether to call a tool (tool_choice auto); the "
              "embedded 135M model does not, and makes answers up. Pass --model with a bigger GGUF.")
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine:
        model = ChatAgentrt(engine=engine, max_tokens=64, parallel_tool_calls=False)
        if prebuilt:
            from langgraph.checkpoint.memory import InMemorySaver
            from langgraph.prebuilt import create_react_agent

            graph = create_react_agent(model, tools, prompt=PROMPT, checkpointer=InMemorySaver())
        else:
            graph = react_graph(model, tools)
        for thread, questions in {"alice": ["What is the weather in Tokyo?", "And in Oslo?"],
                                  "bob": ["What time is it in Paris?"]}.items():
            for q in questions:
                print(f"{thread}: {q}")
                t0 = time.perf_counter()
                before = len((await graph.aget_state({"configurable": {"thread_id": thread}})).values.get("messages", []))
                out = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": thread}})
                show(out["messages"][before + 1:], t0)
        print("KV sessions:", sorted(model.sessions))


if __name__ == "__main__":
    import argparse
    import warnings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prebuilt", action="store_true", help="LangGraph's create_react_agent (tool_choice auto)")
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*create_react_agent has been moved.*")
    anyio.run(main, args.prebuilt, args.model)
