"""llama-cpp-python as a peer, on the same GGUF file.

* shared: one `Llama` for all agents, as `ChatLlamaCpp` is used: the context keeps the
  longest common prefix of what it holds and the new prompt (generate()'s own rule), so a call
  reuses only what the previous call -- of any agent -- left behind;
* per_agent: one `Llama` per agent, its best case: each agent's context still holds its own
  history, so every call reuses its whole previous conversation.

Calls are serialised in arrival order (one CPU, one model). A call: keep the reusable prefix,
evaluate the rest of the prompt, then force-decode the output one `eval` per token, reading
the logits and taking the masked argmax (what a constraint costs). Prefix reuse follows
`Llama.generate(..., reset=True)`: the longest common prefix, minus one token when the whole
prompt matches (fresh logits are needed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import numpy as np

from agentrt.prefixes import common_prefix
from bench.common import cpu
from bench.peers.base import CallRecord, NotRun, RunResult, SerialModel, drive, forced_token
from bench.workloads.replay import ModelCall

INSTALL_HINT = "llama-cpp-python not installed: pip install 'agentrt[bench]' (compiles llama.cpp)"


def llama_cpp_missing() -> str | None:
    """None if llama_cpp imports, else the reason it cannot run."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as exc:  # ImportError, or a broken shared library (OSError)
        return INSTALL_HINT if isinstance(exc, ImportError) else f"llama-cpp-python does not load: {exc}"
    return None


def open_llama(path: str, n_ctx: int = 8192, n_threads: int = 2, lora_path: str | None = None):
    """A `Llama` on the GGUF at `path` (settings of the benchmark's brief), with the GGUF LoRA
    file `lora_path` applied (llama.cpp's `--lora`)."""
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                 n_batch=512, verbose=False, logits_all=False, lora_path=lora_path)


def reusable_prefix(llm, prompt: list[int]) -> int:
    """Tokens of `prompt` whose KV `llm` already holds and may keep (generate()'s rule)."""
    lcp = common_prefix(np.asarray(llm.input_ids[:llm.n_tokens]).tolist(), list(prompt))
    return lcp - 1 if lcp == len(prompt) else lcp


def last_logits(llm) -> np.ndarray:
    """The logits of the last evaluated token (a view of llama.cpp's buffer)."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def llama_forced(llm, prompt: list[int], output: list[int], t_submit: float) -> tuple[list[int], float, int]:
    """(decoded tokens, ttft seconds, prompt tokens computed) of one forced call."""
    keep = reusable_prefix(llm, prompt)
    llm.n_tokens = keep  # eval() drops the KV past n_tokens first
    llm.eval(prompt[keep:])
    toks = [forced_token(last_logits(llm), output[0])]
    first = time.perf_counter()
    for want in output[1:]:
        llm.eval([toks[-1]])
        toks.append(forced_token(last_logits(llm), want))
    return toks, first - t_submit, len(prompt) - keep


class LlamaCppSystem:
    """llama-cpp-python with one shared `Llama` or one per agent."""

    def __init__(self, name: str, path: str, per_agent: bool, n_threads: int = 2,
                 loras: list[str] | None = None) -> None:
        self.name, self.path, self.per_agent, self.n_threads = name, path, per_agent, n_threads
        self.loras = loras  # per agent: agent i's instance runs GGUF LoRA file loras[i]
        self._llms: list = []

    @classmethod
    def shared(cls, path: str, n_threads: int = 2) -> "LlamaCppSystem | NotRun":
        return cls._make("llamacpp_shared", path, False, n_threads)

    @classmethod
    def per_agent_system(cls, path: str, n_threads: int = 2) -> "LlamaCppSystem | NotRun":
        return cls._make("llamacpp_per_agent", path, True, n_threads)

    @classmethod
    def per_adapter_system(cls, path: str, loras: list[str], n_threads: int = 2) -> "LlamaCppSystem | NotRun":
        """One `Llama` per agent, agent i's with LoRA file loras[i] (llama.cpp's server does not
        batch requests of different adapters together; one instance each is its best case)."""
        return cls._make("llamacpp_per_adapter", path, True, n_threads, loras)

    @classmethod
    def _make(cls, name, path, per_agent, n_threads, loras=None):
        reason = llama_cpp_missing()
        return NotRun(name, reason) if reason else cls(name, path, per_agent, n_threads, loras)

    def _llm(self, i: int):
        while len(self._llms) <= i:
            lora = None if self.loras is None else self.loras[len(self._llms)]
            self._llms.append(open_llama(self.path, n_threads=self.n_threads, lora_path=lora))
        return self._llms[i]

    async def warmup(self) -> None:
        llama_forced(self._llm(0), list(range(100, 164)), [5, 6, 7, 8], time.perf_counter())

    async def run(self, scripts, arrival: str) -> RunResult:
        index = {s[0].agent: i for i, s in enumerate(scripts)}
        llms = [self._llm(i) for i in range(len(scripts) if self.per_agent else 1)]
        for llm in llms:
            llm.reset()

        def call(c: ModelCall, t_submit: float) -> CallRecord:
            llm = llms[index[c.agent]] if self.per_agent else llms[0]
            toks, ttft, computed = llama_forced(llm, c.prompt, c.output, t_submit)
            return CallRecord(c.agent, c.turn, ttft, time.perf_counter() - t_submit, len(c.prompt),
                              computed, len(toks), toks == c.output)

        records, wall = await drive(scripts, arrival, SerialModel(call))
        sub = sum(r.prompt_tokens for r in records)
        comp = sum(r.computed_prompt_tokens for r in records)
        return RunResult(self.name, records, wall, {
            "prompt_submitted": sub, "prompt_computed": comp, "prompt_cached": sub - comp,
            "hit_rate": (sub - comp) / sub if sub else 0.0, "llama_instances": len(llms)})

    def close(self) -> None:
        """Free the llama.cpp contexts."""
        for llm in self._llms:
            llm.close()
        self._llms.clear()


LLAMA_CPP = "llama-cpp-python==0.3.36"  # the peer; its PyPI release is a source build (~15-20 min here)


# llama.cpp built without -march=native: on Intel Xeons with AMX, ggml's AMX path crashes on the
# first ~100-token prompt (bench/README.md, multi-agent benchmark); AVX-512 (VNNI, BF16) without AMX runs
AVX512_NO_AMX = " ".join(f"-DGGML_{k}" for k in (
    "NATIVE=OFF", "AVX=ON", "AVX2=ON", "FMA=ON", "F16C=ON", "AVX512=ON", "AVX512_VNNI=ON", "AVX512_BF16=ON",
    "AMX_TILE=OFF", "AMX_INT8=OFF", "AMX_BF16=OFF"))


def ensure_llama_cpp(allowed: bool) -> None:
    """Install the llama.cpp peer into this environment when it is missing (pinned; it never
    pulls torch). Without it the llama.cpp rows are reported as not run, with the reason."""
    if importlib.util.find_spec("llama_cpp") is not None or not allowed:
        return
    print(f"installing the llama.cpp peer: pip install {LLAMA_CPP} (compiles llama.cpp; "
          "--no-install skips it)", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", LLAMA_CPP, "diskcache>=5.6"]
    env = dict(os.environ)
    if "amx_tile" in cpu()["cpu_flags"]:  # ggml's AMX path segfaults here: portable AVX-512 build
        env["CMAKE_ARGS"] = AVX512_NO_AMX
        cmd.insert(4, "--no-cache-dir")  # (not a cached wheel built with -march=native)
    if subprocess.run(cmd, check=False, env=env).returncode != 0:
        print("warning: the llama.cpp peer could not be installed; its rows are reported as not run",
              file=sys.stderr)
