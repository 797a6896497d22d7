"""Tool conventions of chat templates without a `tools` variable: how tool schemas, assistant tool
calls and tool results become messages the model's own template renders (chat_format.py applies one
before the template runs; toolcall/formats.py names the matching call format).

    native    the template renders tools itself (it uses `tools` and mentions `tool_calls`);
    fallback  any other template (SmolLM2's): Hermes tags, messages.py's `fallback`;
    phi4      Phi-4-mini-instruct's template (it reads `message['tools']` and writes `<|tool|>`):
              the tool list goes, as one JSON string, into the system message's `tools` field
              (a system message with the model card's text is added if there is none), which the
              template writes between `<|tool|>` and `<|/tool|>`; an assistant's calls follow
              its content as `<|tool_call|>[...]<|/tool_call|>` (template-made text, so the
              tags are control tokens); a tool result keeps role `tool`, which the template
              renders `<|tool|>{content}<|end|>` -- as Gorilla BFCL's Phi-4-mini handler
              prompts it (the model card defines only the tool list and the calls);
    gemma     Gemma 3's template (`<start_of_turn>`, no tools, roles must alternate, a system
              message prefixes the first user turn): Google's function-calling prompt for Gemma
              (ai.google.dev/gemma/docs/capabilities/function-calling, its JSON variant) and
              the function list go into the system message; an assistant's calls are its
              content, one JSON object a line; tool results go back as a user turn, each
              wrapped in ```tool_output ... ``` (the block Google's Gemma function-calling
              guide, ai.google.dev/gemma/docs/meme-generator, returns results in), consecutive
              results (and a user message right after them) in one turn, since the template
              refuses two user turns in a row. Its system content is trimmed, as the template
              trims every other content.

`TAIL` marks template-made text that follows a message's content (Phi-4's call block): control
tokens in it are control tokens, so what it holds (call arguments) is checked for control-token
text first (chat_format.py). Prepared messages never change earlier ones when messages are appended,
except Gemma's merged tool results: appending one re-renders the turn it joins.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from agentrt.conversation.messages import fallback
from agentrt.toolcall.formats import GEMMA, PHI4

TAIL = "tail"

PHI4_SYSTEM = "You are a helpful assistant with some tools."  # the model card's tool prompt
GEMMA_INSTRUCTION = (
    "You have access to functions. If you decide to invoke any of the function(s), you MUST put it "
    'in the format of\n{"name": function name, "parameters": dictionary of argument name and its value}\n\n'
    "You SHOULD NOT include any other text in the response if you call a function\n"
)
_PHI4_TOOLS = re.compile(r"""message\s*(?:\[\s*['"]tools['"]\s*\]|\.tools\b)""")


def detect_convention(source: str, native: bool) -> str:
    """The tool convention of a template (see the module docstring)."""
    if native:
        return "native"
    if "<|tool|>" in source and _PHI4_TOOLS.search(source):
        return "phi4"
    if "<start_of_turn>" in source:
        return "gemma"
    return "fallback"


def _function(tool: Mapping[str, Any]) -> Any:
    return tool.get("function", tool)


def _calls(msg: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]


def phi4(msgs: list[dict[str, Any]], tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Phi-4-mini's convention (module docstring) on normalized messages."""
    out = []
    for msg in msgs:
        if msg.get("tool_calls"):
            out.append({"role": "assistant", "content": msg["content"] or "", TAIL: PHI4.render_calls(_calls(msg))})
        else:
            out.append(dict(msg))
    if tools:
        listed = json.dumps([_function(t) for t in tools], ensure_ascii=False)
        if out and out[0]["role"] == "system":
            out[0]["tools"] = listed
        else:
            out.insert(0, {"role": "system", "content": PHI4_SYSTEM, "tools": listed})
    return out


def gemma(msgs: list[dict[str, Any]], tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Gemma 3's convention (module docstring) on normalized messages."""
    out: list[dict[str, Any]] = []
    merged = False  # out[-1] is a user turn holding tool results
    for msg in msgs:
        role = msg["role"]
        if role == "tool" or (role == "user" and merged):
            text = f"```tool_output\n{msg['content']}\n```" if role == "tool" else msg["content"]
            if merged:
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
            merged = True
            continue
        merged = False
        if msg.get("tool_calls"):
            calls = GEMMA.render_calls(_calls(msg))
            out.append({"role": "assistant", "content": f"{msg['content']}\n{calls}" if msg["content"] else calls})
        else:
            out.append({**msg, "content": msg["content"].strip()} if role == "system" else dict(msg))
    if tools:
        block = GEMMA_INSTRUCTION + json.dumps([_function(t) for t in tools], ensure_ascii=False, indent=2)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


PREPARE = {"fallback": fallback, "phi4": phi4, "gemma": gemma}


def joined(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the template sees them: each TAIL appended to its content."""
    return [{**m, "content": (m["content"] or "") + m[TAIL]} if TAIL in m else m for m in msgs]
