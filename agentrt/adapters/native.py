"""LoRA adapters laid out for the compiled CPU kernel (kernels/csrc/lora.cpp).

`describe(adapter, nlayers)` builds an adapter's AgrtAdapter once (its parts, and per layer and
projection where they start), kept with the adapter; `step_struct(segments)` builds a step's
AgrtLoraStep (a few structs per step: one per segment). The kernel reads the tensors in place:
A [rank, in] and B's transposed storage [rank, out], fp32 or bf16.
"""

from __future__ import annotations

import ctypes

import torch

from agentrt.adapters.lora import PROJECTIONS, LoraAdapter
from agentrt.kernels import native

NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def runs_native(adapter: LoraAdapter) -> bool:
    """The kernel can run `adapter`: CPU tensors in fp32 or bf16, B transposed in storage."""
    for projs in adapter.layers.values():
        for parts in projs.values():
            for p in parts:
                if (p.a.device.type != "cpu" or p.a.dtype not in NATIVE_DTYPES or p.b.dtype != p.a.dtype
                        or not p.a.is_contiguous() or not p.b.t().is_contiguous()):
                    return False
    return True


def describe(adapter: LoraAdapter):
    """The adapter's ctypes AgrtAdapter, built once and kept on the adapter (with the arrays it
    points into); None when the kernel cannot run it."""
    cached = adapter.native
    if cached is not None:
        return cached or None
    if not runs_native(adapter):
        adapter.native = False
        return None
    nlayers = max(adapter.layers, default=-1) + 1
    flat, index = [], [0]
    for layer in range(nlayers):
        for proj in PROJECTIONS:
            for p in adapter.layers.get(layer, {}).get(proj, ()):
                flat.append(native.LoraPart(p.a.data_ptr(), p.b.data_ptr(), p.a.shape[0],
                                            int(p.a.dtype == torch.bfloat16), p.a.shape[1], p.b.shape[0], p.col))
            index.append(len(flat))
    parts = (native.LoraPart * max(len(flat), 1))(*flat)
    idx = (ctypes.c_int32 * len(index))(*index)
    desc = native.Adapter(ctypes.addressof(parts), ctypes.addressof(idx), nlayers)
    desc.keep = (parts, idx)
    adapter.native = desc
    return desc


def step_struct(segments):
    """The AgrtLoraStep of a step's segments ((r0, r1, adapter) each), or None when one of its
    adapters cannot run natively (the step then takes the torch path)."""
    descs = [describe(ad) for _, _, ad in segments]
    if any(d is None for d in descs):
        return None
    segs = (native.LoraSeg * len(segments))(*(native.LoraSeg(a, e, ctypes.addressof(d))
                                              for (a, e, _), d in zip(segments, descs)))
    st = native.LoraStep(ctypes.addressof(segs), len(segments))
    st.keep = segs
    return st
