// All decoder layers of a decode step in one call: for batches whose sequences each bring a few
// tokens (decode, speculation verify) over fully quantized weights. Removes the per-op Python and
// ctypes cost of the layer-by-layer fused path (agentrt/model/fused.py), which runs the same
// kernels in the same order: the two paths give identical numbers.
#include "common.h"
#include "api.h"

void agrt::linear(const AgrtLinear& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
                  bool accumulate) {
  int64_t off = 0;
  for (int i = 0; i < l.nparts; ++i) {
    const AgrtPart& p = l.parts[i];
    agrt_qgemm(x, T, p.k, ldx, p.q, p.s, p.m, p.half, p.z, p.bits, p.group, p.n, y + off, ldy,
               accumulate ? 1 : 0, l.bias ? l.bias + off : nullptr, l.precise);
    off += p.n;
  }
}

extern "C" void agrt_decoder_layers(const AgrtLayer* layers, int32_t nlayers, const AgrtDims* d,
                                    float* x, int64_t T, const int64_t* pos, const float* cos_t,
                                    const float* sin_t, const int64_t* slots, void* const* k_caches,
                                    void* const* v_caches, const int64_t* page_table,
                                    int64_t max_pages, const int64_t* cu_q, const int64_t* kv_lens,
                                    const int64_t* seqs, int64_t nseq, const int64_t* local_slots,
                                    const int64_t* local_table, int64_t local_max_pages,
                                    const AgrtLoraStep* lora) {
  const int64_t hd = (int64_t)d->heads * d->head_dim;
  const int64_t qkv_n = hd + 2LL * d->kv_heads * d->head_dim;
  float* h = agrt_scratch<float>(kSlotH, (size_t)(T * d->hidden));
  float* qkv = agrt_scratch<float>(kSlotQkv, (size_t)(T * qkv_n));
  float* q = agrt_scratch<float>(kSlotQ, (size_t)(T * hd));
  float* att = agrt_scratch<float>(kSlotAtt, (size_t)(T * hd));
  float* gu = agrt_scratch<float>(kSlotGu, (size_t)(T * 2 * d->inter));
  float* act = agrt_scratch<float>(kSlotAct, (size_t)(T * d->inter));
  float* post = agrt_scratch<float>(kSlotPost, (size_t)(T * d->hidden));
  // x += y(in), or x += rmsnorm(y(in)) where the layer norms its output (Gemma); the rows of
  // LoRA adapters add their delta of projection `proj` before the norm
  auto residual = [&](const AgrtLinear& l, const float* in, int64_t ld, const float* norm, int32_t layer,
                      int32_t proj) {
    if (!norm) {
      agrt::linear(l, in, T, ld, x, d->hidden, true);
      return agrt_lora(lora, layer, proj, in, ld, x, d->hidden);
    }
    agrt::linear(l, in, T, ld, post, d->hidden, false);
    agrt_lora(lora, layer, proj, in, ld, post, d->hidden);
    agrt_rmsnorm(post, T, d->hidden, d->hidden, norm, d->eps, post);
    for (int64_t i = 0; i < T * d->hidden; ++i) x[i] += post[i];
  };
  for (int32_t i = 0; i < nlayers; ++i) {
    const AgrtLayer& L = layers[i];
    agrt_rmsnorm(x, T, d->hidden, d->hidden, L.attn_norm, d->eps, h);
    agrt::linear(L.qkv, h, T, d->hidden, qkv, qkv_n, false);
    agrt_lora(lora, i, 0, h, d->hidden, qkv, qkv_n);
    // a sliding-window layer with pages of its own (agentrt/kv/window.py) reads its own table
    const bool loc = local_table && L.window > 0;
    agrt_rope_store(qkv, T, d->heads, d->kv_heads, d->head_dim, pos, L.cos ? L.cos : cos_t, L.sin ? L.sin : sin_t,
                    loc ? local_slots : slots, L.q_norm,
                    L.k_norm, d->eps, k_caches[i], v_caches[i], q, d->kv_mode);
    agrt_attention(q, k_caches[i], v_caches[i], loc ? local_table : page_table, loc ? local_max_pages : max_pages,
                   cu_q, kv_lens, seqs,
                   nseq, d->heads, d->kv_heads, d->head_dim, d->page_size, d->scale, att, d->kv_mode,
                   L.window, L.softcap);
    residual(L.o, att, hd, L.attn_post_norm, i, 1);
    agrt_rmsnorm(x, T, d->hidden, d->hidden, L.mlp_norm, d->eps, h);
    if (L.moe) {
      agrt_moe(L.moe, h, T, d->hidden, x);
      continue;
    }
    agrt::linear(L.gate_up, h, T, d->hidden, gu, 2LL * d->inter, false);
    agrt_lora(lora, i, 2, h, d->hidden, gu, 2LL * d->inter);
    (L.gelu ? agrt_gelu_mul : agrt_silu_mul)(gu, T, d->inter, act);
    residual(L.down, act, d->inter, L.mlp_post_norm, i, 3);
  }
}
