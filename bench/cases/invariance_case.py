"""Batch invariance on the embedded model, for bench_model's JSON: for each way of cutting the
work, do greedy tokens equal one cold, unchunked, single-sequence run (model.generate) of the
same prompt? The full oracle suite is tests/test_invariance.py; this records, beside the speed
figures, that the path they were measured on is the deterministic one."""

from __future__ import annotations

from agentrt.config import EngineConfig
from agentrt.engine.core import EngineCore
from agentrt.model.generate import generate
from agentrt.sampling import SamplingParams

SYSTEM = "You are a helpful travel assistant. Answer briefly, with facts about cities and weather."
QUESTIONS = ("What is the weather usually like in Paris in spring, and what should I pack?",
             "Tell me about Rome.", "List three museums in London.", "Is Lyon larger than Marseille?")
BASE = dict(response_cache_size=0)


def _run(model, prompts, sp, one_by_one: bool, session: bool = False, **cfg) -> list[list[int]]:
    """Greedy outputs of `prompts` on one engine: submitted one after another (each finds the
    KV of the ones before) or all at once (one batch); `session`: one session's turns."""
    core = EngineCore(model, EngineConfig(**{**BASE, **cfg}))
    sess = core.open_session(core.pool.acquire("session", 0)) if session else None
    reqs = []
    for p in prompts:
        seq_id = None if sess is not None else core.pool.acquire("transient", 0)
        reqs.append(core.add_request(list(p), sp, lambda ev: None, seq_id=seq_id, session=sess))
        while one_by_one and core.has_work():
            core.step()
    while core.has_work():
        core.step()
    core.check_invariants()
    return [r.output for r in reqs]


def _turns(tok, model, sp) -> list[list[int]]:
    """A conversation's prompts, each the last prompt + its greedy reply + a new question."""
    prompts, hist = [], []
    for q in QUESTIONS:
        turn = f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
        hist = hist + tok.encode("<|im_end|>\n" + turn) if hist else tok.encode(
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" + turn)
        prompts.append(hist)
        hist = hist + generate(model, hist, sp)
    return prompts


def check(lm, max_tokens: int = 32) -> dict:
    """{"deterministic": all cases equal the oracle, "invariance_cases": {case: bool}}."""
    model, tok = lm.model, lm.tokenizer
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    chats = _turns(tok, model, sp)
    fresh = [tok.encode(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
                        "<|im_start|>assistant\n") for q in QUESTIONS]
    want = {id(p): generate(model, p, sp) for p in (*chats, *fresh)}
    cases = {
        "radix_hits_one_after_another": (fresh, dict(one_by_one=True)),
        "session_reuse": (chats, dict(one_by_one=True, session=True)),
        "chunk_16": (fresh, dict(one_by_one=True, chunk_min=16, chunk_max=16, n_batch=16)),
        "chunk_64": (fresh, dict(one_by_one=True, chunk_min=64, chunk_max=64, n_batch=64)),
        "chunk_512": (fresh, dict(one_by_one=True, chunk_min=512, chunk_max=512, n_batch=512)),
        "batch_8_with_unrelated": (fresh + chats, dict(one_by_one=False)),
        "speculation_on": (chats, dict(one_by_one=False, enable_speculation=True)),
        "speculation_off": (chats, dict(one_by_one=False, enable_speculation=False)),
    }
    res = {}
    for name, (prompts, kw) in cases.items():
        outs = _run(model, prompts, sp, **kw)
        res[name] = outs == [want[id(p)] for p in prompts]
    return {"deterministic": all(res.values()), "invariance_cases": res}
