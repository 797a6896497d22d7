"""Deterministic synthetic agent workflows at the token level.

An agent's conversation: a system prompt with tool schemas (the anchor), then per turn a new
message (user text or a tool result) and the assistant's generated reply. Contents are made of
real words so the embedded tokenizer gives realistic token counts. Seeded: same seed, same work.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

WORDS = ("agent tool call result file search query weather city price order status report "
         "summary error retry cache token model prompt schema value key list table row column "
         "user account invoice payment shipping address date time zone region server latency").split()


def tool_schemas(n: int, rng: random.Random) -> list[dict]:
    tools = []
    for i in range(n):
        props = {f"{rng.choice(WORDS)}_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                                             "description": " ".join(rng.choices(WORDS, k=8))}
                 for j in range(rng.randrange(2, 5))}
        tools.append({"type": "function", "function": {
            "name": f"{rng.choice(WORDS)}_{rng.choice(WORDS)}_{i}",
            "description": " ".join(rng.choices(WORDS, k=20)),
            "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}})
    return tools


def text_of_tokens(tok, n_tokens: int, rng: random.Random) -> str:
    """Random prose of about n_tokens tokens under `tok`."""
    words = []
    while True:
        words.extend(rng.choices(WORDS, k=16))
        text = " ".join(words)
        if len(tok.encode(text)) >= n_tokens:
            ids = tok.encode(text)[:n_tokens]
            return tok.decode(ids)


@dataclass(frozen=True)
class Workflow:
    """Token-level plan of one agent: anchor tokens, then per turn the new tokens and how many
    tokens the model generates."""

    anchor: list[int]
    turns: list[tuple[list[int], int]]


def make_workflow(fmt, tok, *, seed: int, turns: int, anchor_tokens: int, new_tokens: tuple[int, int],
                  gen_tokens: tuple[int, int], shared_anchor: bool = True) -> Workflow:
    rng = random.Random(seed)
    arng = random.Random(0 if shared_anchor else seed)
    tools = tool_schemas(6, arng)
    system = "You are an agent. Use the tools. " + text_of_tokens(tok, max(anchor_tokens - len(fmt.encode(
        [{"role": "system", "content": "x"}], tools=tools, add_generation_prompt=False)), 8), arng)
    msgs = [{"role": "system", "content": system}]
    anchor = fmt.encode(msgs, tools=tools, add_generation_prompt=False)
    plan = []
    for t in range(turns):
        role = "user" if t == 0 else "tool"
        body = text_of_tokens(tok, rng.randrange(*new_tokens), rng)
        msg = {"role": role, "content": body} if role == "user" else \
            {"role": "tool", "content": json.dumps({"result": body}), "tool_call_id": f"call_{t}"}
        delta = fmt.encode_delta(msgs, [msg], tools=tools)
        plan.append((delta, rng.randrange(*gen_tokens)))
        msgs = msgs + [msg, {"role": "assistant", "content": "ok"}]
    return Workflow(anchor, plan)
