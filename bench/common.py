"""Shared helpers of the benchmark scripts: timing, machine bounds, results files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]  # the repository root
RESULTS = ROOT / "bench" / "results"


def timeit(fn, repeat: int = 3, warmup: int = 1) -> float:
    """Median seconds of fn() over `repeat` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def gemm_flops(dtype: torch.dtype, n: int = 1024, repeat: int = 5) -> float:
    """Measured dense matmul FLOP/s of this machine for `dtype` (n x n x n)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    sec = timeit(lambda: torch.mm(a, b), repeat=repeat, warmup=2)
    return 2 * n ** 3 / sec


def read_bandwidth(mb: int = 512, repeat: int = 5) -> float:
    """Measured memory read bandwidth in bytes/s (a reduction over a buffer >> caches)."""
    x = torch.ones(mb * 2 ** 20 // 4, dtype=torch.float32)
    sec = timeit(lambda: x.sum(), repeat=repeat, warmup=1)
    return x.numel() * 4 / sec


def cpu() -> dict:
    """The CPU's model name, its kind (this project meets AMD EPYC and Intel Xeon with AMX, whose
    figures differ: compare only ratios from one run) and the vector extensions the kernels use."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name, flags = info.get("model name", platform.processor() or "unknown"), set(info.get("flags", "").split())
    kind = ("intel-amx" if "amx_tile" in flags else "intel" if "Intel" in name
            else "amd-epyc" if "EPYC" in name else "amd" if "AMD" in name else platform.machine())
    return {"cpu_model": name, "cpu_kind": kind,
            "cpu_flags": sorted(flags & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8"})}


def machine() -> dict:
    """The machine's facts every bench JSON records: CPU model and ISA flags, agentrt's compiled
    kernels (their flags, whether the VNNI kernels are in), the peer's build where installed."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, **cpu(), "agentrt_kernels": kernel_facts(), "llama_cpp_build": peer_build(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def kernel_facts() -> dict:
    from agentrt.kernels import native

    lib = native.load()
    if lib is None:
        return {"built": False, "path": "torch fallback"}
    return {"built": True, "flags": " ".join(native.flags()), "avx512_vnni_kernels": bool(lib.agrt_has_vnni()),
            "amx_kernels": bool(lib.agrt_has_amx())}


def peer_build() -> dict | None:
    """llama-cpp-python's version and the ISA its llama.cpp was built with (its own report);
    None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    info = llama_cpp.llama_print_system_info()
    info = info.decode() if isinstance(info, bytes) else str(info)
    return {"version": llama_cpp.__version__, "system_info": info.strip(" |")}


def write_results(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def print_table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{x:.3g}" if isinstance(x, float) else str(x) for x in r])
    Console().print(t)


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every linear layer (packed integers + scales
    when quantized, else the dense matrix) and the output head; the embedding table is not read
    (one row per token), even when the head shares it."""
    from agentrt.model.decoder import Dense
    from agentrt.model.quant import QLinear

    total = 0
    for mod in model.modules():
        if isinstance(mod, QLinear):
            total += mod.weight_bytes
        elif isinstance(mod, Dense):
            total += mod.weight_t.numel() * mod.weight_t.element_size()
    return total
