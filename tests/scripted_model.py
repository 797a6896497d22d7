"""A model whose replies are scripted, for tests of the APIs above the model: the engine (batches,
KV pages, sessions, the radix cache, speculation), the grammar, the chat format, the tool-call
parser, the server and the LangChain and LangGraph adapters all run for real; only the logits
come from a script instead of weights. So what a test checks is decided by the API, not by how
well a 135M model happens to answer (the model's numbers are checked by the parity tests).

The model writes each token's id into its KV slot (the first key value of layer 0, a float32
store: exact for every id) and reads a sequence's ids back through its page table, so prefix
reuse, page copies and the KV tier carry them as they carry keys and values. It asks
`reply(prompt)` once for the assistant reply of a prompt (the text up to and including the last
assistant header) and writes the reply's tokens one by one, then the end of the turn (tokens a
grammar forced, cut another way, are matched by their text). Where what was written so far is
not a prefix of the reply (a grammar masked the scripted token, or a speculative draft is being
verified), the model says the turn ends: under a grammar that forbids the end, the engine takes
the lowest allowed id instead, so a reply the constraint does not admit comes out visibly
different from the script.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from agentrt.model.config import ModelConfig
from agentrt.model.decoder import DecoderModel
from agentrt.model.loaders.load import LoadedModel
from tests.conftest import smol_tokenizer

ASSISTANT = "<|im_start|>assistant\n"  # (SmolLM2's chat template: ChatML)
LIKELY = 30.0  # the scripted token's logit; every other token's is 0


class ScriptedModel(DecoderModel):
    """forward() as DecoderModel's (logits [L, V] of the batch's logits rows), from a script."""

    def __init__(self, tokenizer, reply: Callable[[str], str | None], special: bool = False):
        cfg = ModelConfig(arch="llama", vocab_size=tokenizer.vocab_size, hidden_size=16,
                          intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                          rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                          tie_word_embeddings=True, attention_bias=False)
        super().__init__(cfg)
        self.tokenizer, self.reply, self.special = tokenizer, reply, special
        self.end = tokenizer.eos_token_ids[0]
        self.header = tokenizer.encode(ASSISTANT, special=True)
        self.kv_dtype = torch.float32  # (token ids kept exactly)
        self._scripts: dict[str, tuple[str, list[int]] | None] = {}  # prompt -> (reply, its ids)

    def forward(self, input_ids, positions, kv, meta, logits_rows=None, path=None) -> torch.Tensor:
        ids = kv.k[0].view(-1, self.cfg.num_kv_heads * self.cfg.head_dim)[:, 0]  # [slots], a view
        ids[meta.slot_mapping] = input_ids.to(ids.dtype)
        rows = range(input_ids.numel()) if logits_rows is None else logits_rows.tolist()
        out = torch.zeros(len(rows), self.cfg.vocab_size)
        page = meta.page_size
        for i, r in enumerate(rows):
            b = bisect.bisect_right(meta.cu_q, r) - 1  # the row's sequence
            pos = torch.arange(int(positions[r]) + 1)
            table = meta.page_table[b].cpu()
            out[i, self.next_token(ids[table[pos // page] * page + pos % page].long().tolist())] = LIKELY
        return out

    def next_token(self, history: list[int]) -> int:
        at = _rfind(history, self.header)
        if at < 0:
            return self.end
        prompt, written = history[:at + len(self.header)], history[at + len(self.header):]
        key = self.tokenizer.decode(prompt)
        if key not in self._scripts:
            reply = self.reply(key)
            ids = None if reply is None else self.tokenizer.encode(reply, special=self.special)
            self._scripts[key] = None if reply is None else (reply, ids)
        if self._scripts[key] is None:
            return self.end
        script, ids = self._scripts[key]
        if written == ids[:len(written)]:  # the scripted tokens so far
            return ids[len(written)] if len(written) < len(ids) else self.end
        text = self.tokenizer.decode(written)  # (tokens a grammar forced, cut another way)
        if text == script or not script.startswith(text):
            return self.end
        return self.tokenizer.encode(script[len(text):])[0]


def scripted(reply: Callable[[str], str | None], special: bool = False) -> LoadedModel:
    """A LoadedModel (the engine's input) over SmolLM2's tokenizer whose replies `reply` writes
    (special=True: control-token strings in a reply are written as those tokens)."""
    tok = smol_tokenizer()
    model = ScriptedModel(tok, reply, special).eval()
    return LoadedModel(model, tok, model.cfg, "scripted")


def _rfind(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1


def last_user(prompt: str) -> str:
    """The content of the last user message of a ChatML prompt."""
    head = "<|im_start|>user\n"
    at = prompt.rfind(head)
    return "" if at < 0 else prompt[at + len(head):].split("<|im_end|>", 1)[0]

