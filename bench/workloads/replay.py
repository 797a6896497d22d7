"""Token-level replay scripts: every workload becomes, per agent, a list of model calls.

A `ModelCall` holds the whole prompt (conversation so far + the generation prompt) and the
output the model is forced to decode (ending with the chat format's end-of-turn token). Every
system under test gets exactly these token ids and decodes exactly `output`, so all do
identical work. Prompts are built incrementally with `ChatFormat.encode_delta`, like
`agentrt.runtime.agent.Agent` builds them, so call k+1's prompt starts with call k's prompt +
output (checked by `check_script`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

FINAL_ANSWER = "Done."


@dataclass(frozen=True)
class ModelCall:
    """One model call of one agent. `tool_latency_s`: how long the tools whose results this
    prompt carries ran, i.e. the wait between the previous call's end and this call (0 first).
    `tools`: names of the tools `output` calls (empty for a final answer), so an agent can tell
    the engine which tools it waits on (`Session.expect_tools`) and tool latencies can be drawn
    per tool. `offered`: the tools the prompt declares (OpenAI dicts), for a run under the tool
    grammar (bench/cases/ff_case.py)."""

    agent: int
    turn: int
    prompt: list[int]
    output: list[int]
    tool_latency_s: float
    tools: tuple[str, ...] = ()
    offered: tuple = field(default=(), compare=False, repr=False)


class ScriptBuilder:
    """Builds one agent's calls: `ask(new_messages)` then `answer(assistant_message)`, repeated."""

    def __init__(self, fmt, agent: int, system: str, tools: Sequence[dict] | None) -> None:
        self.fmt, self.agent, self.tools = fmt, agent, list(tools) if tools else None
        self.messages: list[dict] = [{"role": "system", "content": system}]
        self.tokens: list[int] = fmt.encode(self.messages, tools=self.tools, add_generation_prompt=False)
        self.calls: list[ModelCall] = []
        self._prompt: list[int] | None = None
        self._latency = 0.0
        eos = tuple(fmt.tokenizer.eos_token_ids)
        end = fmt.encode_assistant_tokens([])  # the template's end-of-turn ids
        self._stop = end[0] if end and end[0] in eos else eos[0]

    def ask(self, new_messages: list[dict], tool_latency_s: float = 0.0) -> None:
        """Append user/tool messages; the next call's prompt is the conversation + generation prompt."""
        self.tokens += self.fmt.encode_delta(self.messages, new_messages, tools=self.tools,
                                             add_generation_prompt=False)
        self.messages += new_messages
        self._prompt = self.tokens + self.fmt.generation_prompt_tokens()
        self._latency = tool_latency_s

    def answer(self, message: dict) -> ModelCall:
        """Record the call whose forced output is `message` (an assistant message)."""
        if self._prompt is None:
            raise ValueError("ask() must come before answer()")
        delta = self.fmt.encode_delta(self.messages, [message], tools=self.tools, add_generation_prompt=False)
        gen = self.fmt.generation_prompt_tokens()
        end = self.fmt.encode_assistant_tokens([])
        if delta[:len(gen)] != gen or delta[len(delta) - len(end):] != end:
            raise ValueError("the assistant turn does not render as generation prompt + body + end of turn")
        output = delta[len(gen):len(delta) - len(end)] + [self._stop]
        names = tuple(c["function"]["name"] for c in message.get("tool_calls") or ())
        call = ModelCall(self.agent, len(self.calls), self._prompt, output, self._latency, names,
                         tuple(self.tools or ()))
        self.tokens = self._prompt + self.fmt.encode_assistant_tokens(output)
        if self.tokens != self._prompt[:len(self._prompt) - len(gen)] + delta:
            raise AssertionError("forced output does not continue the conversation token-exactly")
        self.messages.append(message)
        self.calls.append(call)
        self._prompt = None
        return call


def tool_call_message(calls: list[dict], call_ids: list[str]) -> dict:
    """An assistant message making `calls` ([{"name", "arguments"}]) with the given ids."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c, i in zip(calls, call_ids)]}


def tool_result_messages(results: list[dict], call_ids: list[str]) -> list[dict]:
    """Tool messages answering `call_ids` (content made a string)."""
    out = []
    for r, i in zip(results, call_ids):
        content = r["content"] if isinstance(r["content"], str) else json.dumps(r["content"])
        msg = {"role": "tool", "content": content, "tool_call_id": i}
        if r.get("name"):
            msg["name"] = r["name"]
        out.append(msg)
    return out


def bfcl_script(fmt, agent: int, entry, tool_latency_s: float = 0.0) -> list[ModelCall]:
    """One BFCL entry (bench/workloads/bfcl.py `BfclEntry`) as one agent's calls: per round the
    ground-truth calls as one forced assistant message, their real results fed back as tool
    messages; after a turn's last round the forced final answer FINAL_ANSWER."""
    b = ScriptBuilder(fmt, agent, entry.system, entry.tools)
    n = 0
    for turn in entry.turns:
        b.ask(list(turn.user))
        for calls, results in turn.rounds:
            ids = [f"call_{n + j}" for j in range(len(calls))]
            n += len(calls)
            b.answer(tool_call_message(calls, ids))
            b.ask(tool_result_messages(results, ids), tool_latency_s)
        b.answer({"role": "assistant", "content": FINAL_ANSWER})
    return b.calls


def check_script(calls: Sequence[ModelCall], max_context: int | None = None) -> None:
    """Raise if one agent's calls are not prefix-consistent (call k+1's prompt starts with call
    k's prompt + output) or the last prompt + output exceeds `max_context`."""
    for prev, nxt in zip(calls, calls[1:]):
        head = prev.prompt + prev.output
        if nxt.prompt[:len(head)] != head or nxt.agent != prev.agent:
            raise AssertionError(f"agent {prev.agent}: call {nxt.turn} does not extend call {prev.turn}")
    if max_context is not None and calls and len(calls[-1].prompt) + len(calls[-1].output) > max_context:
        raise AssertionError(f"agent {calls[-1].agent}: {len(calls[-1].prompt) + len(calls[-1].output)} "
                             f"tokens exceed the model's context of {max_context}")


def script_stats(scripts: Sequence[Sequence[ModelCall]]) -> dict:
    """Sizes of a workload: agents, calls, prompt/output tokens, longest final history."""
    calls = [c for s in scripts for c in s]
    return {"agents": len(scripts), "calls": len(calls),
            "turns_max": max((len(s) for s in scripts), default=0),
            "prompt_tokens": sum(len(c.prompt) for c in calls),
            "output_tokens": sum(len(c.output) for c in calls),
            "final_history_max": max((len(s[-1].prompt) + len(s[-1].output) for s in scripts if s), default=0),
            "final_history_sum": sum(len(s[-1].prompt) + len(s[-1].output) for s in scripts if s)}
