"""The compiled CPU kernels (`kernels/csrc/*.cpp`): built with the system C++ compiler, loaded
with ctypes, with a pure-torch fallback for every operation (kernels/reference.py,
kernels/packing.py) when no compiler is present.

The library is a plain C ABI (no torch headers: it builds in seconds) and uses OpenMP from the
same libgomp torch has loaded, so its threads are torch's threads. `make` builds it
(`python -m agentrt.kernels.build`); otherwise the first use builds it (~10 s). Built files go
to a cache folder keyed by a hash of the sources, flags and compiler, so an edit rebuilds.

    AGENTRT_NATIVE=0            never build or load it (the torch fallback runs everywhere)
    AGENTRT_KERNEL_CACHE=DIR    where built libraries go (default ~/.cache/agentrt/kernels)
    AGENTRT_KERNEL_CFLAGS=...   extra compiler flags (e.g. -mno-avx512f: the portable loops)
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch  # (imported first: loads torch's libgomp, whose thread pool the library then shares)

from agentrt.errors import ConfigError

SRC_DIR = Path(__file__).resolve().parent / "csrc"
SOURCES = ("qgemm.cpp", "amx.cpp", "qrows.cpp", "ops.cpp", "attention.cpp", "layers.cpp", "moe.cpp", "lora.cpp")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c++17",
         "-ffp-contract=off", "-fno-math-errno")

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
SIGNATURES = {
    "agrt_has_vnni": ([], ctypes.c_int),
    "agrt_has_amx": ([], ctypes.c_int),
    "agrt_qgemm": ([_P, _I64, _I64, _I64, _P, _P, _P, _I32, _I32, _I32, _I32, _I64, _P, _I64, _I32, _P, _I32], None),
    "agrt_qrefine": ([_P, _I64, _I64, _I64, _P, _P, _P, _I32, _I32, _I32, _I32, _I64, _P, _I64, _I32], None),
    "agrt_qrows": ([_P, _P, _P, _I32, _I32, _I32, _I32, _I64, _P, _I64, _P], None),
    "agrt_rmsnorm": ([_P, _I64, _I64, _I64, _P, _F32, _P], None),
    "agrt_rope_store": ([_P, _I64, _I32, _I32, _I32, _P, _P, _P, _P, _P, _P, _F32, _P, _P, _P, _I32], None),
    "agrt_attention": ([_P, _P, _P, _P, _I64, _P, _P, _P, _I64, _I32, _I32, _I32, _I32, _F32, _P, _I32, _I32,
                        _F32], None),
    "agrt_silu_mul": ([_P, _I64, _I64, _P], None),
    "agrt_gelu_mul": ([_P, _I64, _I64, _P], None),
    "agrt_argmax": ([_P, _I64, _I64, _I64, _P], None),
    "agrt_apply_bitmask": ([_P, _P, _I64], None),
    "agrt_moe": ([_P, _P, _I64, _I64, _P], None),
    "agrt_decoder_layers": ([_P, _I32, _P, _P, _I64, _P, _P, _P, _P, _P, _P, _P, _I64, _P, _P, _P, _I64,
                             _P, _P, _I64, _P], None),
    "agrt_lora": ([_P, _I32, _I32, _P, _I64, _P, _I64], None),
}


class Part(ctypes.Structure):  # AgrtPart in csrc/api.h
    _fields_ = [("q", _P), ("s", _P), ("m", _P), ("z", _I32), ("bits", _I32), ("group", _I32),
                ("half", _I32), ("n", _I64), ("k", _I64)]


class Linear(ctypes.Structure):  # AgrtLinear
    _fields_ = [("parts", Part * 3), ("nparts", _I32), ("precise", _I32), ("bias", _P), ("n_out", _I64)]


class Moe(ctypes.Structure):  # AgrtMoe
    _fields_ = [("router", _P), ("gate_up", _P), ("down", _P), ("n_experts", _I32), ("top_k", _I32),
                ("norm_topk", _I32), ("inter", _I64)]


class Layer(ctypes.Structure):  # AgrtLayer
    _fields_ = [("attn_norm", _P), ("mlp_norm", _P), ("qkv", Linear), ("o", Linear),
                ("gate_up", Linear), ("down", Linear), ("q_norm", _P), ("k_norm", _P), ("moe", _P),
                ("window", _I32), ("attn_post_norm", _P), ("mlp_post_norm", _P), ("cos", _P), ("sin", _P),
                ("gelu", _I32), ("softcap", _F32)]


class LoraPart(ctypes.Structure):  # AgrtLoraPart
    _fields_ = [("a", _P), ("b", _P), ("rank", _I32), ("bf16", _I32), ("n_in", _I64), ("n_out", _I64),
                ("col", _I64)]


class Adapter(ctypes.Structure):  # AgrtAdapter
    _fields_ = [("parts", _P), ("index", _P), ("nlayers", _I32)]


class LoraSeg(ctypes.Structure):  # AgrtLoraSeg
    _fields_ = [("r0", _I64), ("r1", _I64), ("adapter", _P)]


class LoraStep(ctypes.Structure):  # AgrtLoraStep
    _fields_ = [("segs", _P), ("nseg", _I32)]


class Dims(ctypes.Structure):  # AgrtDims
    _fields_ = [("hidden", _I32), ("inter", _I32), ("heads", _I32), ("kv_heads", _I32),
                ("head_dim", _I32), ("page_size", _I32), ("eps", _F32), ("scale", _F32),
                ("kv_mode", _I32)]


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTRT_KERNEL_CACHE") or Path.home() / ".cache" / "agentrt" / "kernels")


def enabled() -> bool:
    return os.environ.get("AGENTRT_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def flags() -> tuple[str, ...]:
    return (*FLAGS, *os.environ.get("AGENTRT_KERNEL_CFLAGS", "").split())


def library_path(cxx: str) -> Path:
    h = hashlib.sha256()
    for name in ("common.h", "api.h", "qmat.h", "attention_seg.h", *SOURCES):
        h.update((SRC_DIR / name).read_bytes())
    h.update(" ".join((cxx, *flags(), _cpu_flags())).encode())
    return cache_dir() / f"libagentrt_cpu-{h.hexdigest()[:16]}.so"


def build(verbose: bool = False) -> Path:
    """Compile the library (if its hashed file is missing) and return its path."""
    cxx = _compiler()
    if cxx is None:
        raise ConfigError("no C++ compiler found (g++); install one or set AGENTRT_NATIVE=0")
    out = library_path(cxx)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [cxx, *flags(), *(str(SRC_DIR / s) for s in SOURCES), "-o", str(tmp_out)]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ConfigError(f"building the CPU kernels failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp_out, out)  # atomic: a concurrent builder finds a whole file or none
    return out


def load() -> ctypes.CDLL | None:
    """The loaded library, or None when disabled (AGENTRT_NATIVE=0, read on every call so tests
    can switch it) or when it cannot be built: callers then take the torch fallback."""
    return _load() if enabled() else None


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(str(build()))
    except (ConfigError, OSError) as exc:
        import warnings

        warnings.warn(f"agentrt CPU kernels unavailable, using the torch fallback: {exc}", stacklevel=2)
        return None
    for name, (args, res) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def available() -> bool:
    return load() is not None


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, -1) of CPU float32 rows [B, V] through the compiled kernel (a
    vectorized pass per row, rows in parallel: torch's takes ~1 ns per value), else torch's."""
    lib = load() if logits.dim() == 2 else None
    if (lib is None or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or logits.stride(-1) != 1 or logits.shape[1] == 0):
        return torch.argmax(logits, dim=-1)
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    lib.agrt_argmax(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0), out.data_ptr())
    return out


def apply_bitmask(logits: torch.Tensor, words: torch.Tensor) -> bool:
    """logits [V] (CPU float32, contiguous) in place: -inf where the token's bit in `words`
    (int32 [>= ceil(V / 32)]) is 0, by the compiled kernel; False (nothing done) without it."""
    lib = load()
    if (lib is None or logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 1
            or not logits.is_contiguous() or words.dtype != torch.int32 or not words.is_contiguous()
            or words.numel() * 32 < logits.shape[0]):
        return False
    lib.agrt_apply_bitmask(logits.data_ptr(), words.data_ptr(), logits.shape[0])
    return True


@lru_cache(maxsize=1)
def _omp_pause():
    """omp_pause_resource_all (OpenMP 5.0) of the libgomp torch loaded; None where torch runs on
    another OpenMP runtime (or none)."""
    for name in (Path(torch.__file__).parent / "lib" / "libgomp.so.1", "libgomp.so.1"):
        try:
            fn = ctypes.CDLL(str(name), mode=os.RTLD_NOLOAD | os.RTLD_LAZY).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
        return fn
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (`omp_pause_resource_all(omp_pause_soft)`;
    its next parallel region starts them again). Why: libgomp keeps one pool of workers per
    thread that ran a parallel region, and once the process holds more OpenMP threads than CPUs
    it stops spin-waiting between regions (GOMP_SPINCOUNT's throttled count): every region then
    pays a futex wake-up. A model loaded on the event loop's thread and run in the engine's step
    thread is exactly that case: a decode step of the embedded model took 17 ms instead of 6 on
    2 cores. The thread that hands the compute to another one calls this. Returns whether a
    pool was released."""
    fn = _omp_pause()
    return fn is not None and fn(1) == 0
