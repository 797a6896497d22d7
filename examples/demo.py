"""agentrt demo: chat with the embedded SmolLM2-135M through a persistent KV session.

Interactive when stdin is a terminal; otherwise (or with --script) it plays a short scripted
conversation. Each turn prefills only the new tokens: the usage line shows how many prompt
tokens came from the session's KV.   python examples/demo.py [--script] [--model PATH]

The embedded SmolLM2-135M answers simple factual questions (capitals, languages) and little more:
ask it to translate, count or reason and it makes things up; use `--model PATH` (a bigger GGUF)
for that. It also works best with its chat template's own system message (the default here); a
custom one (`--system "You are a concise assistant."`) throws the 135M off.
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from agentrt import Engine, EngineConfig, SamplingParams, load_model
from agentrt.conversation.chat_format import ChatFormat
from agentrt.model.tokenizer import IncrementalDecoder

SCRIPT = ["Hi! What is the capital of France?", "And of Italy?", "Thanks! What language do they speak in Italy?"]


async def chat_turns(turns, model: str, system: str | None = None) -> None:
    lm = load_model(model)
    fmt = ChatFormat(lm.tokenizer)
    # no system message: the chat template's own default (SmolLM2's names the model) works best
    # for a small instruct model; a custom one ("You are a concise assistant.") derails the 135M
    messages = [{"role": "system", "content": system}] if system else []
    async with Engine(lm, EngineConfig(kv_cache_tokens=16384)) as engine:
        async with await engine.open_session(tag="demo") as session:
            async for user in turns:
                messages.append({"role": "user", "content": user})
                prompt = fmt.encode(messages)
                dec, text, t0 = IncrementalDecoder(lm.tokenizer, skip_special=True), [], time.perf_counter()
                print("assistant> ", end="", flush=True)
                async for ev in engine.generate(prompt, SamplingParams(max_tokens=96), session=session):
                    for tok in ev.token_ids:
                        piece = dec.push(tok)
                        text.append(piece)
                        print(piece, end="", flush=True)
                    usage = ev.usage
                print(dec.flush())
                print(f"  [{usage.prompt_tokens} prompt tokens, {usage.cached_tokens} from the session's "
                      f"KV, {usage.completion_tokens} generated, {time.perf_counter() - t0:.2f}s]")
                messages.append({"role": "assistant", "content": "".join(text).strip()})


async def scripted():
    for line in SCRIPT:
        print(f"user> {line}")
        yield line


async def interactive():
    while True:
        line = await anyio.to_thread.run_sync(lambda: input("user> "))
        if line.strip() in ("", "exit", "quit"):
            return
        yield line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--script", action="store_true", help="play the scripted conversation")
    ap.add_argument("--model", default="smollm2-135m", help="embedded name, .gguf file or HF dir")
    ap.add_argument("--system", default=None, help="a system message (default: the chat template's own)")
    args = ap.parse_args()
    turns = scripted() if args.script or not sys.stdin.isatty() else interactive()
    anyio.run(chat_turns, turns, args.model, args.system)


if __name__ == "__main__":
    main()
