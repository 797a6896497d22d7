"""Agents with MCP tools: the tools of an MCP server (here examples/mcp_weather_server.py, which
this example starts over stdio) become agentrt tools with `agentrt.tools.mcp.MCPTools`, on the
embedded SmolLM2-135M.

    python examples/mcp_tools.py [--model path/to/model.gguf]

Each MCP tool keeps its JSON schema, so the model's calls are constrained by the grammar and
validated like a Python tool's; the call goes to the server and its text comes back as the
result. The agent must call a tool (`tool_choice="required"`) and its turn ends when the tool has
run (`stop_at_tools`): the answer is the tool's result, as a 135M model cannot reliably phrase
one. Each question is its own conversation: the agents share the prefix of instructions and tool
schemas through the radix cache, and the 135M model does not carry one question's tool choice
into the next. A tool error or a dead server comes back as a tool error message, and the agent goes on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio

from agentrt import Agent, Engine, EngineConfig, Runtime, SamplingParams, load_model
from agentrt.tools.mcp import MCPTools

SERVER = Path(__file__).resolve().parent / "mcp_weather_server.py"
QUESTIONS = {"What is the weather in Paris?": ("weather", "Paris"),
             "What time is it in Tokyo?": ("local_time", "Tokyo"),
             "What is the weather in Oslo today?": ("weather", "Oslo")}


async def run(lm) -> list[tuple[str, str, str, str]]:
    """(question, tool called, its arguments, answer) for each question, on the loaded model."""
    out = []
    async with MCPTools(command=sys.executable, args=[str(SERVER)]) as mcp, \
            Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine, Runtime(engine) as rt:
        print(f"MCP server tools: {[t.name for t in mcp.tools]}")
        names = [t.name for t in mcp.tools]
        agent = Agent("travel", "You answer travel questions with the tools: weather for the weather, "
                      "local_time for the time.", mcp.tools, tool_choice="required", stop_at_tools=names,
                      settings=SamplingParams(max_tokens=48, temperature=0))
        for i, q in enumerate(QUESTIONS):  # one conversation per question (a thread each)
            result = await (await rt.spawn(agent.fresh(f"travel-{i}"))).ask(q)
            call = result.tool_results[0]
            args = next(c for m in result.messages for c in m.get("tool_calls") or ())["function"]["arguments"]
            print(f"{q}\n  call   {call.name}({args})\n  answer {call.content}")
            out.append((q, call.name, args, call.content))
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file or model directory (default: embedded)")
    anyio.run(run, load_model(ap.parse_args().model))
