"""`agentrt info`: what a model is and how this machine will run it."""

from __future__ import annotations

import os
import platform
import time
from collections import Counter
from collections.abc import Iterator

import torch


def _weights(model) -> tuple[int, str]:
    """(parameters, formats by parameter count: e.g. "Q4_1 79%, Q8_0 21%")."""
    from agentrt.model.device_quant import DeviceWeight
    from agentrt.model.quant import QLinear

    sizes: Counter[str] = Counter()
    seen = set()
    for mod in model.modules():
        if isinstance(mod, QLinear):
            for p in mod.parts:
                sizes[p.fmt] += p.n * p.k
                seen.add(id(p.q))
    packed = {id(w): w for w in model.modules() if isinstance(w, DeviceWeight)}  # (a tied head's once)
    for w in packed.values():
        sizes[w.fmt.replace("float", "f")] += w.n * w.k
    for p in model.parameters():
        sizes[str(p.dtype).removeprefix("torch.").replace("float", "f")] += p.numel()
    for name, buf in model.named_buffers():
        if buf.dtype == torch.uint8 and id(buf) not in seen and name.endswith(".q"):
            sizes["packed"] += buf.numel()
    total = sum(sizes.values()) or 1
    return total, ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in sizes.most_common() if v)


def _memory_gib() -> str:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return f"{pages * size / 2**30:.1f} GiB"
    except (ValueError, OSError):
        return "unknown"


def _bandwidth() -> str:
    x = torch.ones(256 * 2**20 // 4)
    x.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        x.sum()
    return f"{5 * x.numel() * 4 / (time.perf_counter() - t0) / 1e9:.1f} GB/s read"


def describe(lm, *, bandwidth: bool = False) -> Iterator[tuple[str, str]]:
    from agentrt.conversation.chat_format import ChatFormat
    from agentrt.kernels import native

    cfg, model = lm.config, lm.model
    yield "source", str(lm.source)
    yield "architecture", (f"{cfg.arch}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads} heads "
                           f"({cfg.num_kv_heads} KV), head dim {cfg.head_dim}, vocab {cfg.vocab_size}")
    total, formats = _weights(model)
    yield "parameters", f"{total / 1e6:.1f} M"
    yield "weights", formats
    yield "context", f"{cfg.max_position_embeddings} tokens (rope theta {cfg.rope_theta:g})"
    yield "kv cache dtype", str(model.kv_dtype).removeprefix("torch.")
    if lm.tokenizer is not None:
        chat = ChatFormat(lm.tokenizer)
        yield "chat/tool format", chat.tool_format.name
    lib = native.load()
    if lib is None:
        kernels = "torch fallback (compiled kernels off: AGENTRT_NATIVE=0 or no compiler)"
    else:
        kernels = (f"compiled CPU kernels (AVX-512 VNNI: {'yes' if lib.agrt_has_vnni() else 'no'}, "
                   f"AMX: {'yes' if lib.agrt_has_amx() else 'no'})")
    yield "kernels", f"{kernels}; forward path {model.forward_path}"
    yield "machine", f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {_memory_gib()} RAM"
    yield "torch", f"{torch.__version__}, {torch.get_num_threads()} threads"
    if bandwidth:
        yield "memory bandwidth", _bandwidth()
