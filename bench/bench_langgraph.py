"""LangGraph graph on ChatAgentrt vs the same graph on a plain transformers chat model.

The graph: a model node and a ToolNode with an InMemorySaver checkpointer (a user question ->
a constrained tool call -> the tool runs -> an answer), run for T turns on each of N threads,
turn by turn across threads. LangGraph resends the whole history on every call: ChatAgentrt
keeps each thread's KV session and prefills only the new messages; the reference
(`bench/lg_reference.py`, same weights, same prompt tokens, same grammar) prefills everything.
Latency of a turn = one `graph.ainvoke` (two model calls and one tool call).

    python bench/bench_langgraph.py [--quick]
writes bench/results/langgraph.json (`per_turn_speedup` = mean reference turn latency / mean
ChatAgentrt turn latency).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from agentrt import Engine, EngineConfig, load_model  # noqa: E402
from agentrt.integrations.langgraph import ChatAgentrt  # noqa: E402
from agentrt.session.chat import ChatFormat  # noqa: E402
from bench.common import machine, print_table, write_results  # noqa: E402

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Seoul", "Perth", "Dakar", "Hanoi", "Rome", "Bern"]
SYSTEM = ("You are the travel desk assistant of a small agency that books trips for business customers. "
          "You answer questions about the cities our customers travel to: the weather, local time, "
          "currency, airports and public holidays. Always look facts up with the tools before answering; "
          "never guess. Answer in one or two short sentences. If a tool fails, say so and suggest what the "
          "customer could do instead. Be friendly, precise and brief; use metric units and 24h times.")


def make_tools():
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: the city name, e.g. "Paris"
        """
        return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy", "wind_kmh": 12})

    @tool
    def get_local_time(city: str) -> str:
        """Local time in a city (24h clock).

        Args:
            city: the city name
        """
        return json.dumps({"city": city, "time": "14:05", "utc_offset": "+01:00"})

    @tool
    def get_currency(country: str) -> str:
        """Currency of a country and its rate to the euro.

        Args:
            country: the country name
        """
        return json.dumps({"country": country, "currency": "EUR", "rate": 1.0})

    @tool
    def list_airports(city: str, max_results: int = 3) -> str:
        """Airports serving a city.

        Args:
            city: the city name
            max_results: how many airports to list
        """
        return json.dumps({"city": city, "airports": ["MAIN", "SECOND"][:max_results]})

    return [get_weather, get_local_time, get_currency, list_airports]


def build_graph(model, tools):
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    call = model.bind_tools(tools, tool_choice="required")
    answer = model.bind_tools(tools, tool_choice="none")

    async def agent(state):
        m = answer if isinstance(state["messages"][-1], ToolMessage) else call
        return {"messages": [await m.ainvoke([SystemMessage(SYSTEM)] + state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile(checkpointer=InMemorySaver())


async def run_graph(model, threads: int, turns: int, rep: int) -> dict:
    """Turn latencies [turn][thread], per-call usage, and the tool calls made."""
    tools = make_tools()
    app = build_graph(model, tools)
    lat = [[0.0] * threads for _ in range(turns)]
    calls, usage = [], []
    for t in range(turns):
        for th in range(threads):
            city = CITIES[(th * 5 + t + rep) % len(CITIES)]
            q = {"messages": [HumanMessage(f"What is the weather in {city} today?")]}
            cfg = {"configurable": {"thread_id": f"r{rep}-t{th}"}}
            before = len((await app.aget_state(cfg)).values.get("messages", []))
            t0 = time.perf_counter()
            out = await app.ainvoke(q, cfg)
            lat[t][th] = time.perf_counter() - t0
            for m in out["messages"][before + 1:]:
                if getattr(m, "usage_metadata", None):
                    usage.append((t, m.usage_metadata))
                calls += [(c["name"], c["args"]) for c in getattr(m, "tool_calls", [])]
    return {"lat": lat, "calls": calls, "usage": usage}


def cache_read_fraction(usage, from_turn: int = 1) -> float:
    rows = [u for t, u in usage if t >= from_turn]
    return sum(u["input_token_details"]["cache_read"] for u in rows) / max(1, sum(u["input_tokens"] for u in rows))


def reference_model(lm, max_tokens: int):
    from bench.lg_reference import HFChatModel
    from bench.peers.hf_peer import load_hf_gguf
    from agentrt.toolcall.grammar import GrammarFactory

    return HFChatModel(hf=load_hf_gguf(lm.source), fmt=ChatFormat(lm.tokenizer), max_tokens=max_tokens,
                       grammars=GrammarFactory(lm.tokenizer, lm.config.vocab_size))


async def run_agentrt(lm, threads, turns, rep, max_tokens):
    async with Engine(lm, EngineConfig(kv_cache_tokens=32768, response_cache_size=0)) as eng:
        model = ChatAgentrt(engine=eng, max_tokens=max_tokens, parallel_tool_calls=False)
        return await run_graph(model, threads, turns, rep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 threads x 4 turns, 1 repetition")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--turns", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--max-tokens", type=int, default=40)
    args = ap.parse_args()
    threads = args.threads or (2 if args.quick else 4)
    turns = args.turns or (4 if args.quick else 8)
    reps = args.reps or (1 if args.quick else 3)
    lm = load_model("smollm2-135m", quantize="none")  # fp32: the same weights as the transformers reference
    ref = reference_model(lm, args.max_tokens)
    per_rep, a_turns, r_turns, agree, frac = [], [], [], [], []
    for rep in range(reps):
        a = anyio.run(run_agentrt, lm, threads, turns, rep, args.max_tokens)
        r = anyio.run(run_graph, ref, threads, turns, rep)
        am, rm = [statistics.mean(x) for x in a["lat"]], [statistics.mean(x) for x in r["lat"]]
        per_rep.append(statistics.mean(rm) / statistics.mean(am))
        a_turns.append(am)
        r_turns.append(rm)
        agree.append(sum(x == y for x, y in zip(a["calls"], r["calls"])) / max(1, len(r["calls"])))
        frac.append(cache_read_fraction(a["usage"]))
    am = [statistics.mean(col) for col in zip(*a_turns)]
    rm = [statistics.mean(col) for col in zip(*r_turns)]
    print_table(f"LangGraph ToolNode graph, {threads} threads x {turns} turns, mean turn latency (ms)",
                ["turn", "transformers", "ChatAgentrt", "speedup"],
                [[t + 1, round(y * 1e3), round(x * 1e3), round(y / x, 2)] for t, (x, y) in enumerate(zip(am, rm))])
    res = {"machine": machine(), "quick": args.quick, "threads": threads, "turns": turns, "reps": reps,
           "per_turn_speedup": statistics.median(per_rep), "per_rep_speedup": per_rep,
           "chatagentrt_turn_ms": [x * 1e3 for x in am], "transformers_turn_ms": [y * 1e3 for y in rm],
           "cache_read_fraction_from_turn2": statistics.mean(frac),
           "tool_calls_agree_with_reference": statistics.mean(agree),
           "max_tokens": args.max_tokens, "weights": "fp32 (both)"}
    print(f"per_turn_speedup = {res['per_turn_speedup']:.2f}  cache_read from turn 2: "
          f"{res['cache_read_fraction_from_turn2']:.1%}  tool calls agree: {res['tool_calls_agree_with_reference']:.0%}")
    print("wrote", write_results("langgraph", res))


if __name__ == "__main__":
    main()
