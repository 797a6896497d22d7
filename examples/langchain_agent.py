"""LangChain v1's agent, `langchain.agents.create_agent`, on ChatAgentrt: a calculator tool,
a checkpointer and two middlewares, on the embedded SmolLM2-135M (or your model: --model PATH).

    python examples/langchain_agent.py
    python examples/langchain_agent.py --model path/to/qwen2.5-1.5b-instruct-q4_k_m.gguf --auto

What happens:
  * create_agent binds the tools with `ChatAgentrt.bind_tools`; the tool_choice a middleware sets
    (`request.override(tool_choice=...)`) is enforced by agentrt's grammar, so every call is
    well formed and matches the tool's schema.
  * A 135M model seldom decides on its own to call a tool, so `ToolThenAnswer` asks for a call
    of `add` when a question arrives (tool_choice "add") and for a plain answer once the result
    is back (tool_choice "none"). With a larger model, --auto leaves the choice to the model
    (try it on the 135M one: it answers without the tool, and adds badly).
  * `CompactHistory` edits what the model sees: the tool calls and results of earlier questions
    are left out (the checkpoint keeps them). agentrt keeps one KV session per thread and reuses
    the longest prefix of the history it already holds, edited or not; `cache_read` in the usage
    below is the part of each prompt served from that KV instead of being computed again (a new
    question's first call reuses the history up to the previous question: what follows it changed).
"""

from __future__ import annotations

import time

import anyio
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from agentrt import Engine, EngineConfig, load_model
from agentrt.integrations.langgraph import ChatAgentrt

SYSTEM = ("You are a helpful assistant. Use the add tool to add numbers. "
          "Then give the user the result in a short sentence.")
QUESTIONS = ["What is 17 + 25?", "How much is 1200 plus 34?", "Please add 250 and 750."]


@tool
def add(a: int, b: int) -> int:
    """Add two integers and return their sum.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


class ToolThenAnswer(AgentMiddleware):
    """A user question -> tool_choice "add" (a call of add, forced by the grammar); a tool
    result -> tool_choice "none" (a text answer, cut where a small model starts to echo the
    tool-result markup). auto=True leaves the choice to the model."""

    def __init__(self, auto: bool = False) -> None:
        super().__init__()
        self.auto = auto

    def _choose(self, request):
        if isinstance(request.messages[-1], ToolMessage):
            return request.override(tool_choice="none", model_settings={"stop": ["</tool_response>"]})
        return request.override(tool_choice="auto" if self.auto else "add")

    def wrap_model_call(self, request, handler):
        return handler(self._choose(request))

    async def awrap_model_call(self, request, handler):
        return await handler(self._choose(request))


class CompactHistory(AgentMiddleware):
    """The model sees earlier questions and answers, not the tool calls and results behind them."""

    def _compact(self, request):
        msgs = request.messages
        last_question = max(i for i, m in enumerate(msgs) if isinstance(m, HumanMessage))
        kept = [m for i, m in enumerate(msgs) if i >= last_question
                or not (isinstance(m, ToolMessage) or (isinstance(m, AIMessage) and m.tool_calls))]
        return request.override(messages=kept)

    def wrap_model_call(self, request, handler):
        return handler(self._compact(request))

    async def awrap_model_call(self, request, handler):
        return await handler(self._compact(request))


def usage(m: AIMessage) -> str:
    u = m.usage_metadata or {}
    return f"[prompt {u.get('input_tokens')} tokens, {u['input_token_details']['cache_read']} from KV already held]"


async def main(source: str, auto: bool) -> None:
    print(f"loading {source} ...")
    lm = load_model(source)
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine:
        model = ChatAgentrt(engine=engine, max_tokens=48)
        agent = create_agent(model, tools=[add], system_prompt=SYSTEM,
                             middleware=[ToolThenAnswer(auto), CompactHistory()], checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "calculator"}}
        correct = 0
        for question in QUESTIONS:
            t0 = time.perf_counter()
            before = len((await agent.aget_state(config)).values.get("messages", []))
            out = await agent.ainvoke({"messages": [HumanMessage(question)]}, config)
            print(f"\nuser: {question}")
            result = None
            for m in out["messages"][before + 1:]:
                if isinstance(m, AIMessage) and m.tool_calls:
                    for call in m.tool_calls:
                        print(f"  tool call    {call['name']}({call['args']})  {usage(m)}")
                elif isinstance(m, ToolMessage):
                    result = m.content
                    print(f"  tool result  {m.content}")
                elif isinstance(m, AIMessage):
                    ok = result is not None and result in m.content
                    correct += ok
                    print(f"  answer       {m.content.strip()!r}  {usage(m)}")
            print(f"  ({time.perf_counter() - t0:.1f}s)")
        print(f"\n{correct}/{len(QUESTIONS)} answers state the sum the tool computed; "
              f"KV sessions held: {sorted(model.sessions)}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file, an HF directory or an embedded name")
    ap.add_argument("--auto", action="store_true", help="tool_choice 'auto': the model decides (larger models)")
    args = ap.parse_args()
    anyio.run(main, args.model, args.auto)
