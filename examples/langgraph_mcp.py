"""The LangGraph path to MCP tools: `langchain-mcp-adapters` loads the tools of an MCP server
(examples/mcp_weather_server.py, started here over stdio) as LangChain tools, and a LangGraph
ReAct graph runs them with ChatAgentrt on the embedded SmolLM2-135M.

    python examples/langgraph_mcp.py [--model path/to/model.gguf]

The graph is examples/langgraph_react.py's: the model node asks for a call
(`tool_choice="required"`) when a user message arrives and for an answer (`"none"`) after the
tool's result, because the 135M model rarely decides to call a tool on its own. The MCP tools
keep their JSON schemas, so the calls are constrained by the grammar. Each thread keeps one KV
session: only new messages are prefilled.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio
from langchain_core.messages import HumanMessage

from agentrt import Engine, EngineConfig, load_model
from agentrt.integrations.langgraph import ChatAgentrt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from langgraph_react import react_graph, show  # noqa: E402  (the same graph and printout)

SERVER = Path(__file__).resolve().parent / "mcp_weather_server.py"
THREADS = {"alice": ["What is the weather in Tokyo?"], "bob": ["What time is it in Paris?"]}


async def run(lm) -> dict[str, list]:
    """Each thread's messages after its question, on the loaded model."""
    from langchain_mcp_adapters.client import MultiServerMCPClient

    client = MultiServerMCPClient({"weather": {"command": sys.executable, "args": [str(SERVER)], "transport": "stdio"}})
    tools = await client.get_tools()  # one stdio session per call, as the adapters do by default
    print(f"MCP tools: {[t.name for t in tools]}")
    out = {}
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine:
        graph = react_graph(ChatAgentrt(engine=engine, max_tokens=64, parallel_tool_calls=False), tools)
        for thread, questions in THREADS.items():
            for q in questions:
                print(f"{thread}: {q}")
                t0 = time.perf_counter()
                result = await graph.ainvoke({"messages": [HumanMessage(q)]}, {"configurable": {"thread_id": thread}})
                show(result["messages"][1:], t0)
                out[thread] = result["messages"]
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file or model directory (default: embedded)")
    anyio.run(run, load_model(ap.parse_args().model))
