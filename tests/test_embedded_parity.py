"""The embedded SmolLM2 GGUF against transformers loading the same file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrt.model.generate import generate, prompt_logits
from agentrt.sampling import SamplingParams

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three prime numbers."}],
    [{"role": "user", "content": "Écris une phrase sur les chats 🐱."}],
]


@pytest.fixture(scope="module")
def reference(embedded):
    import transformers

    path = Path(embedded.source)
    m = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32)
    return m.eval()


def _prompt_ids(embedded, messages):
    from agentrt.conversation.chat_format import ChatFormat

    return ChatFormat(embedded.tokenizer).encode(messages)


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_greedy_32_tokens_agree_where_reference_is_decisive(embedded, reference, i):
    prompt = _prompt_ids(embedded, PROMPTS[i])
    with torch.no_grad():
        ref_ids = reference.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0]
        ref_logits = reference(ref_ids[None]).logits[0, len(prompt) - 1:-1]
    ours = prompt_logits(embedded.model, ref_ids.tolist())[len(prompt) - 1:-1]
    top2 = ref_logits.topk(2, dim=-1).values
    decisive = (top2[:, 0] - top2[:, 1]) > 1e-3
    assert decisive.sum() >= len(decisive) - 2
    assert torch.equal(ours.argmax(-1)[decisive], ref_logits.argmax(-1)[decisive])
    assert (ours - ref_logits).abs().max() < 1e-2
    # free-running: our own greedy decode follows the reference until a near-tie (if any)
    mine = generate(embedded.model, prompt, SamplingParams(max_tokens=32, ignore_eos=True))
    ref_new = ref_ids[len(prompt):].tolist()
    first_tie = next((j for j, d in enumerate(decisive.tolist()) if not d), len(ref_new))
    assert mine[:first_tie] == ref_new[:first_tie]
