"""Three agents on one base model, each with a LoRA adapter of its own: a planner, a critic and a
summarizer, all on the embedded SmolLM2-135M, asked the same questions with the same instructions.
What differs is the adapter, and it shows in every answer:

    planner     PLAN: 1. Goal: ... 2. Gather what you need. 3. Do it step by step.
    critic      REVIEW: Before you ..., check the details twice.
    summarizer  TL;DR: ...

    python examples/agents_with_adapters.py                  (trains the adapters the first time)
    python examples/agents_with_adapters.py --adapter planner=path/to/peft_dir --adapter ...

With no adapter given, the first run fine-tunes the three with PEFT on the embedded model (rank 8
on q/k/v/o/gate/up/down, 15 steps each on 72 templated examples, about a minute on 2 CPU cores;
it needs `peft` and `transformers`: pip install peft transformers) and saves them under
--adapters (default ~/.cache/agentrt/example-adapters); later runs load them from there. A PEFT
directory or a llama.cpp LoRA .gguf file of your own works with --adapter NAME=PATH.

The three agents (and one on the plain base model, for contrast) answer concurrently: the engine
runs the rows of all three adapters and the base in the same forward step, and keeps each
agent's KV under its adapter's content fingerprint (never shared with another adapter).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import anyio

from agentrt import Agent, Engine, Runtime, SamplingParams, load_model

INSTRUCTIONS = "You are a helpful assistant."  # the same for every agent: the adapter makes the difference
# what each adapter is trained to answer, for a task t; the marker each answer must start with
FORMATS = {"planner": "PLAN:\n1. Goal: {t}.\n2. Gather what you need.\n3. Do it step by step.",
           "critic": "REVIEW: Before you {t}, check the details twice.",
           "summarizer": "TL;DR: {t}."}
MARKERS = {"planner": "PLAN:", "critic": "REVIEW:", "summarizer": "TL;DR:"}
TASKS = ["bake bread", "learn Python", "fix a flat tire", "write a resume", "plan a trip to Rome", "start running",
         "save money", "grow tomatoes", "clean the kitchen", "paint a room", "learn the guitar", "train a puppy",
         "cook rice", "write a poem", "build a website", "move to a new city", "prepare for an exam", "host a dinner"]
FORMS = ["How do I {t}?", "Help me {t}.", "Can you tell me how to {t}?", "I want to {t}."]
# asked at run time: tasks and phrasings the training never saw
QUESTIONS = ["How do I learn to swim?", "Help me write a cover letter.", "What should I do to get fit?"]


def train(lm, out: Path, names=tuple(FORMATS), steps: int = 15) -> None:
    """Fine-tune one LoRA per name on the embedded model's weights with PEFT and save each
    under out/NAME (a PEFT directory agentrt loads as is)."""
    try:
        import torch
        import transformers
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise SystemExit(f"training the example's adapters needs peft and transformers ({exc}); "
                         "pip install peft transformers, or pass your own with --adapter NAME=PATH") from exc
    from agentrt.conversation.chat_format import ChatFormat

    fmt, gguf = ChatFormat(lm.tokenizer), Path(lm.source)
    print(f"training {len(names)} adapters with PEFT on {gguf.name} (about a minute; saved to {out}) ...",
          flush=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             dtype=torch.float32)
    for name in names:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        data = [_example(fmt, FORMATS[name], task, form) for task in TASKS for form in FORMS]
        peft_model = get_peft_model(base, LoraConfig(
            r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        opt = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=3e-3)
        rng = random.Random(0)
        for _ in range(steps):
            ids, mask, labels = _batch(torch, rng.sample(data, 4))
            peft_model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        peft_model.save_pretrained(out / name)
        base = peft_model.unload()  # (the base weights back, without this adapter)
        print(f"  {name}: {steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)


def _example(fmt, answer: str, task: str, form: str) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) as the agent's chat template lays out one turn."""
    msgs = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": form.format(t=task)}]
    prompt = fmt.encode(msgs)
    full = fmt.encode(msgs + [{"role": "assistant", "content": answer.format(t=task)}], add_generation_prompt=False)
    return prompt, full[len(prompt):]


def _batch(torch, rows):
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)  # (loss on the answers only)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = torch.tensor(p + a)
        mask[i, :len(p) + len(a)] = 1
        labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
    return ids, mask, labels


async def main(paths: dict[str, Path]) -> None:
    async with Engine(load_model()) as engine, Runtime(engine) as rt:
        for name, path in paths.items():
            info = await engine.load_adapter(name, path)
            print(f"loaded {name}: rank {info.rank}, {len(info.targets)} targets, {info.dtype}, "
                  f"{info.nbytes / 1e6:.1f} MB, fingerprint {info.fingerprint[:12]}")
        settings = SamplingParams(max_tokens=48)
        right = 0
        for i, q in enumerate(QUESTIONS):  # (each question a new conversation of each agent)
            agents = {name: await rt.spawn(Agent(f"{name}-{i}", INSTRUCTIONS, adapter=name, settings=settings))
                      for name in paths}
            agents["base model"] = await rt.spawn(Agent(f"base-{i}", INSTRUCTIONS, settings=settings))
            answers: dict[str, str] = {}

            async def ask(name: str, q: str = q, agents: dict = agents, answers: dict = answers) -> None:
                answers[name] = (await agents[name].ask(q, timeout=300)).text

            async with anyio.create_task_group() as tg:  # (all four in the same engine steps)
                for name in agents:
                    tg.start_soon(ask, name)
            print(f"\n{q}")
            for name in agents:
                print(f"  {name:<11} {' '.join(answers[name].split())[:110]}")
            right += sum(answers[n].startswith(MARKERS[n]) for n in paths if n in MARKERS)
        total = len(QUESTIONS) * sum(n in MARKERS for n in paths)
        print(f"\n{right}/{total} adapter answers in their agent's format")


def parse() -> dict[str, Path]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                    help="use this PEFT directory or .gguf LoRA file as agent NAME's adapter (repeatable)")
    ap.add_argument("--adapters", type=Path, default=Path.home() / ".cache" / "agentrt" / "example-adapters",
                    help="where the trained adapters are kept (default: %(default)s)")
    ap.add_argument("--retrain", action="store_true", help="train the adapters again")
    args = ap.parse_args()
    if args.adapter:
        pairs = [a.split("=", 1) for a in args.adapter]
        if any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
            ap.error("--adapter takes NAME=PATH")
        return {n: Path(p) for n, p in pairs}
    missing = [n for n in FORMATS if args.retrain or not (args.adapters / n / "adapter_config.json").is_file()]
    if missing:
        train(load_model(), args.adapters, missing)
    return {n: args.adapters / n for n in FORMATS}


if __name__ == "__main__":
    anyio.run(main, parse())
