"""The same tokens on every CPU kind the compiled kernels run on with AVX-512 VNNI (docs/determinism.md).

An Intel Xeon with AMX and an AMD Zen 4 without it gave different greedy tokens on the same
prompt: the first difference was the rmsnorm's sum of squares, an `omp simd` reduction whose
order was the compiler's vector width under `-march=native` (8 lanes on the Xeon, 16 on Zen).
It now sums in an order written out (kernels/csrc/common.h, agrt_sumsq). Here: that order,
exactly; a build tuned for another CPU (Zen's tuning and vector width, no AMX) and another
thread count giving the default path's very bits; and the greedy ids of fixed prompts, pinned.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agentrt.kernels import native

ROOT = Path(__file__).resolve().parents[1]
# what GCC's -march=native gives an AMD Zen 4 beside this machine's: its tuning, 512-bit vectors,
# no AMX and no AVX512-FP16 (appended after -march=native, so they win)
ZEN_LIKE = "-mtune=znver3 -mprefer-vector-width=512 -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -mno-avx512fp16"
PROMPTS = {
    "capital": [{"role": "user", "content": "Hi! What is the capital of France?"}],
    "joke": [{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": "Tell me a joke about cats. Respond in JSON with `setup` and "
                                         "`punchline` keys."}],
}
# greedy ids of the default path (load_model("smollm2-135m"): Q4_1 layers, a Q8_0 table, the
# compiled kernels, a float16 KV cache): the same on every CPU with AVX-512 VNNI, AMX or not,
# at any thread count
PINNED = {
    "capital": [504, 3575, 282, 4649, 314, 7042, 30, 2],  # "The capital of France is Paris."
    "joke": [49, 42, 198, 198, 18, 49, 42, 330, 2644, 314, 253, 2644, 30, 198, 198, 64, 3704, 1311, 42, 330, 2644,
             314, 253, 2644, 30, 198, 198, 504, 2988, 314, 42, 198, 198, 18, 49, 2644, 314, 253, 2644, 30, 198,
             198, 504, 2988, 314, 42, 198, 198],  # (48 tokens: 'A:\n\n"A: A cat is a cat.\n\nPunchline: ...')
}

needs_vnni = pytest.mark.skipif(not (native.available() and native.load().agrt_has_vnni()),
                                reason="the pinned bits are the AVX-512 VNNI kernels' (the portable loops and "
                                       "the torch fallback round otherwise)")


def dot_in_order(a: np.ndarray, x: np.ndarray) -> np.float32:
    """common.h's agrt_dot order: 64 running sums over the whole 64s, folded pairwise, then the rest."""
    n = len(x) // 64 * 64
    lane = np.zeros(64, np.float32)
    for i in range(0, n, 64):
        lane = lane + a[i:i + 64] * x[i:i + 64]
    w = 32
    while w:
        lane[:w] = lane[:w] + lane[w:2 * w]
        w //= 2
    s = lane[0]
    for i in range(n, len(x)):
        s = np.float32(s + a[i] * x[i])
    return s


def _sumsq_in_order(x: np.ndarray) -> np.float32:
    """agrt_sumsq's order (agrt_dot(x, x))."""
    return dot_in_order(x, x)


@pytest.mark.skipif(not native.available(), reason="compiled CPU kernels not built")
@pytest.mark.parametrize("dim", [576, 1536, 64, 100, 7])
def test_rmsnorm_sums_in_its_written_order(dim):
    g = torch.Generator().manual_seed(dim)
    x, w = torch.randn(5, dim, generator=g) * 3, torch.randn(dim, generator=g)
    out, eps = torch.empty_like(x), 1e-5
    native.load().agrt_rmsnorm(x.data_ptr(), 5, dim, dim, w.data_ptr(), eps, out.data_ptr())
    xs, ws = x.numpy(), w.numpy()
    for r in range(5):
        mean = np.float32(_sumsq_in_order(xs[r]) / np.float32(dim) + np.float32(eps))
        inv = np.float32(1) / np.sqrt(mean)
        assert np.array_equal(out[r].numpy(), xs[r] * inv * ws), r


def fingerprint() -> dict:
    """The default path's greedy ids of PROMPTS and a hash of the capital prompt's logits (every
    position: each layer's bits reach them)."""
    from agentrt.conversation.chat_format import ChatFormat
    from agentrt.model.generate import generate, prompt_logits
    from agentrt.model.loaders.load import load_model
    from agentrt.sampling import SamplingParams

    lm = load_model("smollm2-135m")
    chat, out = ChatFormat(lm.tokenizer), {}
    for name, messages in PROMPTS.items():
        ids = chat.encode(messages)
        out[name] = generate(lm.model, ids, SamplingParams(max_tokens=48, temperature=0.0), lm.tokenizer.eos_token_ids)
        if name == "capital":
            out["logits"] = hashlib.sha256(prompt_logits(lm.model, ids).numpy().tobytes()).hexdigest()
    return out


@pytest.mark.embedded
@needs_vnni
def test_greedy_ids_of_fixed_prompts_are_pinned():
    got = fingerprint()
    assert {name: got[name] for name in PINNED} == PINNED


@pytest.mark.slow
@pytest.mark.embedded
@needs_vnni
def test_kernels_built_for_another_cpu_give_the_same_bits(tmp_path):
    """The kernels built as GCC builds them on an AMD Zen 4 (its tuning and vector width, no AMX
    code, AGENTRT_AMX=0), run at one thread, in a fresh process: the default path's logits and
    tokens are this build's, bit for bit."""
    script = "import json, torch; torch.set_num_threads(1); from tests.test_cross_cpu import fingerprint; " \
             "print(json.dumps(fingerprint()))"
    env = dict(os.environ, AGENTRT_KERNEL_CFLAGS=ZEN_LIKE, AGENTRT_KERNEL_CACHE=str(tmp_path), AGENTRT_AMX="0",
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(tmp_path.glob("libagentrt_cpu-*.so")), "the subprocess did not build its own kernels"
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == fingerprint()
