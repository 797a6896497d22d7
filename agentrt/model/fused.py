"""The fused forward: each layer is nine calls into the compiled CPU kernels (kernels/csrc).

Per layer: rmsnorm -> qkv GEMM -> rope + KV store (Qwen3: each q/k head RMS-normalised first, in
the same call) -> paged attention -> o GEMM added into the residual -> rmsnorm -> gate_up GEMM ->
silu*up -> down GEMM added into the residual (Gemma: gelu*up, and the attention's and the MLP's
outputs RMS-normed before they are added; a mixture-of-experts layer: routing and the grouped
expert GEMMs in one call, model/moe.py). When every layer is quantized and every sequence
attends in the kernel, all layers run in one native call (`agrt_decoder_layers`, same kernels,
same order); otherwise layer by layer from Python. The eager torch forward
(`DecoderModel.forward_eager`) issues ~40 small ops per layer; on a 2-core CPU their dispatch
cost exceeded the decode step's own work.

Batch invariance (`model.batch_invariant`, True unless `load_model(batch_invariant=False)`):
every kernel computes a row in an order fixed by that row alone (the quantized GEMM, rmsnorm,
rope and the head refinement per row; attention per row and key count, kernels/csrc/attention.cpp),
so with quantized weights a sequence's logits do not depend on the prefix cache, the chunking,
the batch or speculation: greedy output is the same however the work was cut. Off, prefill
chunks longer than KERNEL_ATTENTION_MAX_Q attend through torch's SDPA (kernels/reference.py),
whose sums follow the chunk's shape: ~8% faster at 8k-token contexts, equal below 4k (bench:
bench/bench_model.py). Dense (fp32) layers run torch's GEMMs, which promise no such order.
"""

from __future__ import annotations

import ctypes
import weakref

import torch

from agentrt.errors import ConfigError
from agentrt.kernels import native
from agentrt.kernels.base import AttentionMeta, is_short_row
from agentrt.kernels.reference import paged_attention_rows
from agentrt.kv.store import KV_MODES, kv_mode
from agentrt.model.moe import MoE
from agentrt.model.moe import describe as describe_moe
from agentrt.model.moe import run_native as run_moe
from agentrt.model.quant import QLinear, linear_slots

PATHS = ("fused", "eager")
KERNEL_ATTENTION_MAX_Q = 16  # without batch invariance, longer chunks attend through torch SDPA
KV_DTYPES = tuple(KV_MODES)  # what the kernels read and write in the KV store


def use_fused(model, path: str) -> bool:
    if path not in PATHS:
        raise ConfigError(f"forward path {path!r} is unknown; choose one of {PATHS}")
    return (path == "fused" and model.dtype == torch.float32 and model.norm.device.type == "cpu"
            and native.available())


def linear(lin, x: torch.Tensor, out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    if isinstance(lin, QLinear):
        return lin(x, out, accumulate)
    y = lin(x)
    if out is None:
        return y
    return out.add_(y) if accumulate else out.copy_(y)


class _Step:
    """Per-forward constants: the native library, tensors of the batch metadata, buffers."""

    def __init__(self, model, positions: torch.Tensor, meta: AttentionMeta, t: int):
        cfg = model.cfg
        lib = native.load()
        if lib is None:  # (use_fused checked it; AGENTRT_NATIVE=0 set since)
            raise ConfigError("the fused forward needs the compiled CPU kernels (AGENTRT_NATIVE=0 or not built)")
        self.lib, self.cfg = lib, cfg
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.positions = positions.to(torch.int64).contiguous()
        self.slots = meta.slot_mapping.contiguous()
        self.cos, self.sin = model.rope.cos, model.rope.sin
        self.local = model.rope_local  # (Gemma 3's sliding-window layers; else model.rope)
        self.meta = meta
        cut = None if model.batch_invariant else KERNEL_ATTENTION_MAX_Q
        short = [b for b, q in enumerate(meta.q_lens) if is_short_row(q, cut)]
        self.long = tuple(b for b, q in enumerate(meta.q_lens) if not is_short_row(q, cut))
        self.short = torch.tensor(short, dtype=torch.int64)
        self.cu = torch.tensor(meta.cu_q, dtype=torch.int64)
        self.kv_lens = meta.kv_lens_t.to(torch.int64).contiguous()
        self.table = meta.page_table.to(torch.int64).contiguous()
        # sliding-window layers with pages of their own (kv/window.py): their table and slots
        loc = meta.local
        self.ltable = None if loc is None else loc.page_table.to(torch.int64).contiguous()
        self.lslots = None if loc is None else loc.slot_mapping.contiguous()
        self.t = t

    def tables(self, local: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots [T], page table [B, W]) a layer reads: a sliding-window layer's own when the
        store keeps them apart."""
        if not local:
            return self.slots, self.table
        if self.lslots is None or self.ltable is None:
            raise ConfigError("a sliding-window layer with pages of its own needs the batch's local table "
                              "(build_batch(..., local_of=store.local_host))")
        return self.lslots, self.ltable

    def buffers(self) -> None:
        """Activations of the layer-by-layer path (the all-layers call keeps its own)."""
        t, cfg = self.t, self.cfg
        self.hbuf = torch.empty(t, cfg.hidden_size)
        self.q = torch.empty(t, self.h * self.d)
        self.attn = torch.empty(t, self.h * self.d)
        self.act = torch.empty(t, cfg.intermediate_size)

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        self.lib.agrt_rmsnorm(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), w.data_ptr(),
                              self.cfg.rms_norm_eps, out.data_ptr())
        return out

    def attention(self, layer: int, kv, attn, qkv: torch.Tensor) -> torch.Tensor:
        k, v, t, scale = kv.k[layer], kv.v[layer], self.q.shape[0], attn.scale
        lib, loc = self.lib, kv.is_local(layer)
        slots, table = self.tables(loc)
        cos, sin = (self.local.cos, self.local.sin) if attn.local_rope else (self.cos, self.sin)
        lib.agrt_rope_store(qkv.data_ptr(), t, self.h, self.hkv, self.d,
                            self.positions.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                            slots.data_ptr(), *head_norms(attn),
                            self.cfg.rms_norm_eps, k.data_ptr(), v.data_ptr(), self.q.data_ptr(),
                            kv_mode(k.dtype))
        if self.short.numel():
            lib.agrt_attention(self.q.data_ptr(), k.data_ptr(), v.data_ptr(), table.data_ptr(),
                               table.shape[1], self.cu.data_ptr(), self.kv_lens.data_ptr(),
                               self.short.data_ptr(), self.short.numel(), self.h, self.hkv, self.d,
                               k.shape[1], scale, self.attn.data_ptr(), kv_mode(k.dtype),
                               attn.window, attn.softcap)
        if self.long:
            q3 = self.q.view(t, self.h, self.d)
            res = paged_attention_rows(q3, k, v, self.meta.for_layer(loc), scale, self.long, attn.window, attn.softcap)
            for b in self.long:
                a, e = self.meta.cu_q[b], self.meta.cu_q[b + 1]
                self.attn[a:e] = res[a:e].reshape(e - a, -1)
        return self.attn


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def head_norms(attn) -> tuple[int | None, int | None]:
    """The per-head q/k norm weights the rope kernel applies (None: none, or OLMoE's whole-
    projection norms, which `norm_projections` applies before it)."""
    return (None, None) if attn.norm_all else (_ptr(attn.q_norm), _ptr(attn.k_norm))


def norm_projections(attn, qkv: torch.Tensor, eps: float) -> None:
    """OLMoE: RMSNorm over the whole q and the whole k projection, in place in `qkv` [T, ...]."""
    hq, hk = attn.h * attn.d, attn.hkv * attn.d
    for a, n, w in ((0, hq, attn.q_norm), (hq, hk, attn.k_norm)):
        qkv[:, a:a + n] = torch.nn.functional.rms_norm(qkv[:, a:a + n], (n,), w, eps)


def check_bounds(model, positions: torch.Tensor, kv, meta: AttentionMeta) -> None:
    """The kernels index raw memory: reject what torch's indexing would have rejected."""
    if kv.k[0].dtype not in KV_DTYPES:
        raise ConfigError(f"the fused forward needs a float32, float16 or int8 KV store, got {kv.k[0].dtype}")
    if positions.numel() == 0:
        return
    if int(positions.min()) < 0 or int(positions.max()) >= model.rope.cos.shape[0]:
        raise ConfigError("batch positions are outside the model's context")
    for layer in {0, *(() if meta.local is None else (kv.local_layers.index(True),))}:
        m, rows = meta.for_layer(kv.is_local(layer)), kv.k[layer].shape[0]
        lo, hi = torch.aminmax(m.slot_mapping)
        plo, phi = torch.aminmax(m.page_table)
        if int(lo) < 0 or int(hi) >= rows * kv.page_size or int(plo) < 0 or int(phi) >= rows:
            raise ConfigError("batch slots or pages are outside the KV store")


def forward(model, input_ids: torch.Tensor, positions: torch.Tensor, kv, meta: AttentionMeta,
            logits_rows: torch.Tensor | None, lora=None) -> torch.Tensor:
    check_bounds(model, positions, kv, meta)
    x = model.embed(input_ids).float().contiguous()  # [T, hidden], the residual stream
    if model.cfg.embed_scale != 1.0:
        x.mul_(torch.tensor(model.cfg.embed_scale, dtype=x.dtype))
    st = _Step(model, positions, meta, x.shape[0])
    lora_st = None if lora is None else lora.native()  # (rows of LoRA adapters: the compiled kernel)
    layers = None if st.long or (lora is not None and lora_st is None) else native_layers(model)
    if layers is not None:  # every layer in one call (decode / verify steps, quantized weights)
        _all_layers(model, layers, st, x, kv, lora_st)
    else:  # (adapters the kernel cannot run: their deltas added between the layer's native calls)
        _layer_by_layer(model, st, x, kv, lora)
    if logits_rows is not None:
        x = x[logits_rows].contiguous()
    h = st.rmsnorm(x, model.norm, torch.empty_like(x))  # (rmsnorm needs no buffers())
    return softcap_logits(linear(model.lm_head, h).float(), model.cfg.final_softcap)


def _layer_by_layer(model, st: _Step, x: torch.Tensor, kv, lora=None) -> None:
    st.buffers()
    for i, blk in enumerate(model.blocks):
        h = st.rmsnorm(x, blk.attn_norm, st.hbuf)
        qkv = linear(blk.attn.qkv, h).contiguous()
        if lora is not None:
            lora.add(i, "qkv", h, qkv)
        if blk.attn.norm_all:
            norm_projections(blk.attn, qkv, st.cfg.rms_norm_eps)
        a = st.attention(i, kv, blk.attn, qkv)
        _residual(st, blk.attn.o, a, x, blk.attn_post_norm, lora, i, "o")
        h = st.rmsnorm(x, blk.mlp_norm, st.hbuf)
        if isinstance(blk.mlp, MoE):
            _moe(model, blk.mlp, st, h, x)
            continue
        gu = linear(blk.mlp.gate_up, h)
        if lora is not None:
            lora.add(i, "gate_up", h, gu)
        act = st.lib.agrt_gelu_mul if blk.mlp.gelu else st.lib.agrt_silu_mul  # (GeGLU: Gemma)
        act(gu.data_ptr(), gu.shape[0], st.act.shape[1], st.act.data_ptr())
        _residual(st, blk.mlp.down, st.act, x, blk.mlp_post_norm, lora, i, "down")


def softcap_logits(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's final logits: cap * tanh(logits / cap) (cap 0: as they are; both paths)."""
    return torch.tanh(logits / cap) * cap if cap else logits


def _residual(st: _Step, lin, a: torch.Tensor, x: torch.Tensor, post_norm: torch.Tensor | None,
              lora=None, layer: int = 0, proj: str = "") -> None:
    """x += lin(a), or x += rmsnorm(lin(a)) with Gemma's post-norm; `lora` (the step's
    LoraStep): the adapters' delta of projection `proj` of `layer` joins it, before the norm."""
    if post_norm is None:
        linear(lin, a, x, accumulate=True)
        if lora is not None:
            lora.add(layer, proj, a, x)
        return
    y = linear(lin, a.contiguous())
    if lora is not None:
        lora.add(layer, proj, a, y)
    x.add_(st.rmsnorm(y, post_norm, torch.empty_like(y)))


def _moe(model, moe: MoE, st: _Step, h: torch.Tensor, x: torch.Tensor) -> None:
    """x += moe(h): the grouped native GEMM when every expert is quantized, else torch."""
    if not moe.quantized():
        x.add_(moe(h))
        return
    key = ("moe", id(moe))
    cached = model.fused_cache.get(key)
    if cached is None or cached[0] is not moe or any(
            e.gate_up is not g or e.down is not d for e, (g, d) in zip(moe.experts, cached[2])):
        cached = (moe, describe_moe(moe, _fill_linear), [(e.gate_up, e.down) for e in moe.experts])
        model.fused_cache[key] = cached
    run_moe(st.lib, cached[1], h, x)
    if moe.shared is not None:  # (Qwen2-MoE: the shared expert, in torch)
        x.add_(moe.shared_part(h))


def _all_layers(model, layers, st: _Step, x: torch.Tensor, kv, lora_st=None) -> None:
    arr, shared = layers
    n = len(model.blocks)
    cached = model.fused_cache.get("kv")  # per-KV-store arguments, rebuilt when the store changes
    if cached is None or cached[0]() is not kv:  # (a weak reference: the store may be freed)
        dims = native.Dims.from_buffer_copy(shared)
        dims.page_size, dims.kv_mode = kv.k[0].shape[1], kv_mode(kv.k[0].dtype)
        cached = (weakref.ref(kv), (ctypes.c_void_p * n)(*(t.data_ptr() for t in kv.k)),
                  (ctypes.c_void_p * n)(*(t.data_ptr() for t in kv.v)), dims)
        model.fused_cache["kv"] = cached
    _, kp, vp, dims = cached
    st.lib.agrt_decoder_layers(
        ctypes.addressof(arr), n, ctypes.addressof(dims), x.data_ptr(), x.shape[0],
        st.positions.data_ptr(), st.cos.data_ptr(), st.sin.data_ptr(), st.slots.data_ptr(), kp, vp,
        st.table.data_ptr(), st.table.shape[1], st.cu.data_ptr(), st.kv_lens.data_ptr(),
        st.short.data_ptr(), st.short.numel(), _ptr(st.lslots), _ptr(st.ltable),
        0 if st.ltable is None else st.ltable.shape[1], None if lora_st is None else ctypes.addressof(lora_st))


def native_layers(model):
    """The ctypes description of every decoder layer (built once per model), or None when a
    layer is not fully quantized (fp32 Dense layers run their matmuls in torch)."""
    cached = model.fused_cache.get("layers")
    # a replaced layer invalidates it (checked every step: the description holds raw pointers into
    # the layers it was built from, which it keeps alive)
    if cached is not None and all(getattr(owner, name) is lin for owner, name, lin in cached[0]):
        return cached[1]
    slots = tuple((owner, name, getattr(owner, name)) for owner, name in linear_slots(model))
    ok = all(isinstance(lin, QLinear) and len(lin.parts) <= 3 for _, _, lin in slots)
    # (layer by layer: OLMoE's whole-projection norms, Qwen2-MoE's shared experts)
    ok = ok and not any(b.attn.norm_all or b.mlp.shared is not None for b in model.blocks)
    value = _describe(model) if ok else None
    model.fused_cache["layers"] = (slots, value)
    return value


def _describe(model):
    cfg = model.cfg
    arr = (native.Layer * len(model.blocks))()
    moes = []  # (kept alive with the array)
    for i, blk in enumerate(model.blocks):
        arr[i].attn_norm, arr[i].mlp_norm = blk.attn_norm.data_ptr(), blk.mlp_norm.data_ptr()
        arr[i].q_norm, arr[i].k_norm = head_norms(blk.attn)
        arr[i].window, arr[i].softcap = blk.attn.window, blk.attn.softcap
        arr[i].gelu = int(blk.mlp.gelu)
        arr[i].attn_post_norm, arr[i].mlp_post_norm = _ptr(blk.attn_post_norm), _ptr(blk.mlp_post_norm)
        if blk.attn.local_rope:  # (Gemma 3's local layers turn by their own table)
            arr[i].cos, arr[i].sin = model.rope_local.cos.data_ptr(), model.rope_local.sin.data_ptr()
        _fill_linear(arr[i].qkv, blk.attn.qkv)
        _fill_linear(arr[i].o, blk.attn.o)
        if isinstance(blk.mlp, MoE):
            moes.append(describe_moe(blk.mlp, _fill_linear))
            arr[i].moe = ctypes.addressof(moes[-1])
        else:
            _fill_linear(arr[i].gate_up, blk.mlp.gate_up)
            _fill_linear(arr[i].down, blk.mlp.down)
    arr.keep = moes
    dims = native.Dims(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                       cfg.head_dim, 0, cfg.rms_norm_eps, cfg.head_dim ** -0.5)
    return arr, dims


def _fill_linear(dst, lin: QLinear) -> None:
    for j, p in enumerate(lin.parts):
        dst.parts[j] = native.Part(p.q.data_ptr(), p.s.data_ptr(), None if p.m is None else p.m.data_ptr(),
                                   p.z, p.bits, p.group, p.half, p.n, p.k)
    dst.nparts, dst.precise, dst.n_out = len(lin.parts), int(lin.precise), lin.n_out
    dst.bias = None if lin.bias is None else lin.bias.data_ptr()
