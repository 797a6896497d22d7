"""Synthetic tool-calling agents as token-level replay scripts (see replay.py).

Each agent: a system prompt with tool schemas (shared by all agents or its own), a user request,
then T model calls: the first T-1 answer with a tool call (`<tool_call>{...}</tool_call>` in
SmolLM2's fallback format), whose result of configurable size comes back as a tool message; the
last answers in short prose. String arguments copy a few words of the latest message, as real
agents copy ids and names out of tool results. Seeded: same arguments, same token ids.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from bench.workloads.agentic import WORDS, text_of_tokens, tool_schemas
from bench.workloads.replay import ModelCall, ScriptBuilder, check_script, tool_call_message, tool_result_messages


@dataclass(frozen=True)
class SyntheticSpec:
    """Sizes of a synthetic workload (tokens unless said otherwise)."""

    agents: int
    turns: int
    anchor_tokens: int = 1000  # system prompt + tool schemas
    user_tokens: int = 150  # the first user message
    result_tokens: tuple[int, int] = (150, 300)  # each tool result, uniform in [lo, hi)
    shared_system: bool = True  # one system prompt + tool set for all agents, else one each
    tool_latency_s: float = 0.0
    n_tools: int = 6  # tool schemas in the system prompt
    max_args: int = 4  # arguments per tool call at most (fewer: shorter forced outputs)
    json_results: bool = True  # tool results as {"status": "ok", "result": ...}, else plain text
    seed: int = 0
    max_context: int = 8192


def _system(fmt, tok, spec: SyntheticSpec, agent: int) -> tuple[str, list[dict]]:
    """(system prompt, tool schemas), sized so the rendered anchor is about anchor_tokens."""
    rng = random.Random(spec.seed * 7919 if spec.shared_system else spec.seed * 7919 + agent + 1)
    tools = tool_schemas(spec.n_tools, rng)
    head = "You are an agent. Use the tools to finish the user's task. "
    base = len(fmt.encode([{"role": "system", "content": head}], tools=tools, add_generation_prompt=False))
    return head + text_of_tokens(tok, max(spec.anchor_tokens - base, 8), rng), tools


def _arguments(schema: dict, source: str, rng: random.Random, max_args: int) -> dict:
    """Arguments for one tool: strings copy 2-5 words of `source`, others are random. The
    required ones always (a call valid under the tool grammar), the rest up to max_args."""
    words = source.split() or WORDS
    args = {}
    params = schema["function"]["parameters"]
    for name, prop in list(params["properties"].items())[:max(max_args, len(params.get("required", ())))]:
        if prop["type"] == "string":
            k = rng.randrange(2, 6)
            i = rng.randrange(max(len(words) - k, 1))
            args[name] = " ".join(words[i:i + k])
        elif prop["type"] == "integer":
            args[name] = rng.randrange(1, 1000)
        else:
            args[name] = rng.random() < 0.5
    return args


def agent_script(fmt, tok, spec: SyntheticSpec, agent: int) -> list[ModelCall]:
    """One agent's `spec.turns` calls."""
    rng = random.Random(spec.seed * 1_000_003 + agent)
    system, tools = _system(fmt, tok, spec, agent)
    b = ScriptBuilder(fmt, agent, system, tools)
    last = "Task: " + text_of_tokens(tok, spec.user_tokens, rng)
    b.ask([{"role": "user", "content": last}])
    for t in range(spec.turns):
        if t == spec.turns - 1:
            summary = " ".join(last.split()[:rng.randrange(8, 16)])
            b.answer({"role": "assistant", "content": f"The task is complete: {summary}."})
            break
        tool = rng.choice(tools)
        call = {"name": tool["function"]["name"], "arguments": _arguments(tool, last, rng, spec.max_args)}
        ids = [f"call_{t}"]
        b.answer(tool_call_message([call], ids))
        last = text_of_tokens(tok, rng.randrange(*spec.result_tokens), rng)
        content = json.dumps({"status": "ok", "result": last}) if spec.json_results else last
        result = {"name": call["name"], "content": content}
        b.ask(tool_result_messages([result], ids), spec.tool_latency_s)
    check_script(b.calls, spec.max_context)
    return b.calls


def synthetic_scripts(fmt, tok, spec: SyntheticSpec) -> list[list[ModelCall]]:
    """Every agent's calls (agent i of the same spec is always the same script)."""
    return [agent_script(fmt, tok, spec, a) for a in range(spec.agents)]
