"""The reference chat model of bench_langgraph.py: a plain LangChain chat model on Hugging Face
transformers, the same weights, no KV reuse across calls.

Every call renders the whole history with the same chat format (the same prompt tokens as
agentrt), prefills all of it, and decodes greedily with transformers' KV cache inside the call.
Tool calls are constrained by the same grammar and parsed by the same validator, so both
systems make the same calls and the graph does the same work; only the serving differs.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from agentrt.integrations.langgraph.messages import normalize_tool_choice, to_openai, tools_to_openai
from agentrt.toolcall import CallComplete, CallInvalid, TextDelta, ToolCallParser
from bench.peers.hf_peer import _cache_name


class HFChatModel(BaseChatModel):
    """transformers `model(...)` per step; the full prompt every call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    hf: Any
    fmt: Any
    grammars: Any
    max_tokens: int = 64
    parallel_tool_calls: bool = False

    @property
    def _llm_type(self) -> str:
        return "hf-transformers-reference"

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        formatted = tools_to_openai(tools)
        return self.bind(tools=formatted, tool_choice=normalize_tool_choice(tool_choice, formatted), **kwargs)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        tools, choice = kwargs.get("tools"), kwargs.get("tool_choice", "auto")
        prompt = self.fmt.encode(to_openai(messages), tools=tools)
        constraint = self.grammars.for_tools(tools, choice, parallel_tool_calls=self.parallel_tool_calls) \
            if tools else None
        out = self._decode(prompt, constraint)
        text = self.fmt.tokenizer.decode(out, skip_special=True)
        msg = self._message(text, tools, choice)
        msg.usage_metadata = {"input_tokens": len(prompt), "output_tokens": len(out),
                              "total_tokens": len(prompt) + len(out), "input_token_details": {"cache_read": 0}}
        return ChatResult(generations=[ChatGeneration(message=msg)])

    @torch.inference_mode()
    def _decode(self, prompt: list[int], constraint) -> list[int]:
        name, eos = _cache_name(self.hf), set(self.fmt.tokenizer.eos_token_ids)
        out = self.hf(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        toks: list[int] = []
        for _ in range(self.max_tokens):
            logits = out.logits[0, -1].float()
            if constraint is not None:
                logits = constraint.mask_logits(logits.clone())
            t = int(torch.argmax(logits))
            toks.append(t)
            if constraint is not None:
                constraint.advance(t)
            if t in eos or (constraint is not None and constraint.is_terminated()):
                break
            out = self.hf(torch.tensor([[t]]), use_cache=True, logits_to_keep=1, **{name: getattr(out, name)})
        return toks

    def _message(self, text: str, tools, choice) -> AIMessage:
        if not tools or choice == "none":
            return AIMessage(text)
        parser = ToolCallParser(tools, wrapper="hermes", parallel_calls=self.parallel_tool_calls)
        parts, calls, ids = [], [], itertools.count()
        for ev in parser.feed(text) + parser.close():
            if isinstance(ev, TextDelta):
                parts.append(ev.text)
            elif isinstance(ev, CallComplete):
                calls.append({"name": ev.name, "args": ev.arguments, "id": f"ref_{next(ids)}"})
            elif isinstance(ev, CallInvalid):
                next(ids)
        return AIMessage("".join(parts), tool_calls=calls)
