"""The reference chat model of bench_langgraph.py: a plain LangChain chat model on Hugging Face
transformers, the same weights, no KV reuse across calls.

Every call renders the whole history with the same chat format and tokenizes it afresh
(`ChatFormat.encode`), prefills all of it, and decodes greedily with transformers' KV cache
inside the call. Tool calls are constrained by the same grammar and parsed by the same
validator. The prompt ids equal ChatAgentrt's only while the history holds no assistant turn:
ChatAgentrt's session ledger keeps the model's *generated* ids for its replies (under the
grammar often a non-canonical BPE split, e.g. `l|is|t` for `list`) where a re-rendering model
feeds the canonical tokenization of the same text. `replay` therefore checks the reference on
ChatAgentrt's exact prompt ids (the like-with-like agreement of the benchmark).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict

from agentrt.integrations.langgraph.messages import normalize_tool_choice, to_openai, tools_to_openai
from agentrt.toolcall import CallComplete, CallInvalid, TextDelta, ToolCallParser
from bench.peers.hf_peer import _cache_name

# a replayed token whose top-2 margin is below this is re-decoded for real (teacher forcing
# and incremental decoding differ by ~1e-5 in the logits)
_TIE = 1e-3


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
        out = self._decode(prompt, self._constraint(tools, choice))
        text = self.fmt.tokenizer.decode(out, skip_special=True)
        msg = self._message(text, tools, choice)
        msg.usage_metadata = {"input_tokens": len(prompt), "output_tokens": len(out),
                              "total_tokens": len(prompt) + len(out), "input_token_details": {"cache_read": 0}}
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _constraint(self, tools, choice):
        return self.grammars.for_tools(tools, choice, parallel_tool_calls=self.parallel_tool_calls) \
            if tools else None

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

    @torch.inference_mode()
    def replay(self, prompt: list[int], generated: list[int], tools=None, choice="auto") -> dict:
        """Greedy decoding from exactly `prompt` (another system's prompt ids) under the same
        grammar, checked against that system's `generated` ids by teacher forcing (one forward).

        Returns tokens_agree (every greedy pick equals `generated`), first_mismatch (index or
        None), min_margin (smallest top-2 logit gap of the masked rows checked; None if every
        row had one allowed token) and tool_calls [(name, args)] of the reference's output
        (decoded for real when the picks disagree or come within _TIE of a tie)."""
        eos = set(self.fmt.tokenizer.eos_token_ids)
        constraint = self._constraint(tools, choice)
        if not generated:
            return {"tokens_agree": True, "first_mismatch": None, "min_margin": None, "tool_calls": []}
        logits = self.hf(torch.tensor([prompt + generated[:-1]]), logits_to_keep=len(generated)).logits[0]
        margin, mismatch = math.inf, None
        for j, t in enumerate(generated):
            row = logits[j].float()
            if constraint is not None:
                row = constraint.mask_logits(row.clone())
            top = torch.topk(row, 2)
            margin = min(margin, float(top.values[0] - top.values[1]))
            if int(top.indices[0]) != t:
                mismatch = j
                break
            if constraint is not None:
                constraint.advance(t)
            if t in eos or (constraint is not None and constraint.is_terminated()):
                break
        toks = generated
        if mismatch is not None or margin < _TIE:
            toks = self._decode(prompt, self._constraint(tools, choice))
        msg = self._message(self.fmt.tokenizer.decode(toks, skip_special=True), tools, choice)
        return {"tokens_agree": mismatch is None, "first_mismatch": mismatch,
                "min_margin": margin if math.isfinite(margin) else None,
                "tool_calls": [(c["name"], c["args"]) for c in msg.tool_calls]}

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
