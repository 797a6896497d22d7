// All decoder layers of a decode step in one call: for batches whose sequences each bring a few
// tokens (decode, speculation verify) over fully quantized weights. Removes the per-op Python and
// ctypes cost of the layer-by-layer fused path (agentrt/model/fused.py), which runs the same
// kernels in the same order: the two paths give identical numbers.
#include "common.h"
#include "api.h"

namespace {

void linear(const AgrtLinear& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy,
            bool accumulate) {
  int64_t off = 0;
  for (int i = 0; i < l.nparts; ++i) {
    const AgrtPart& p = l.parts[i];
    agrt_qgemm(x, T, p.k, ldx, p.q, p.s, p.m, p.z, p.bits, p.group, p.n, y + off, ldy,
               accumulate ? 1 : 0, l.bias ? l.bias + off : nullptr, l.precise);
    off += p.n;
  }
}

}  // namespace

extern "C" void agrt_decoder_layers(const AgrtLayer* layers, int32_t nlayers, const AgrtDims* d,
                                    float* x, int64_t T, const int64_t* pos, const float* cos_t,
                                    const float* sin_t, const int64_t* slots, float* const* k_caches,
                                    float* const* v_caches, const int64_t* page_table,
                                    int64_t max_pages, const int64_t* cu_q, const int64_t* kv_lens,
                                    const int64_t* seqs, int64_t nseq) {
  const int64_t hd = (int64_t)d->heads * d->head_dim;
  const int64_t qkv_n = hd + 2LL * d->kv_heads * d->head_dim;
  std::vector<float> h((size_t)(T * d->hidden)), qkv((size_t)(T * qkv_n)), q((size_t)(T * hd)),
      att((size_t)(T * hd)), gu((size_t)(T * 2 * d->inter)), act((size_t)(T * d->inter));
  for (int32_t i = 0; i < nlayers; ++i) {
    const AgrtLayer& L = layers[i];
    agrt_rmsnorm(x, T, d->hidden, d->hidden, L.attn_norm, d->eps, h.data());
    linear(L.qkv, h.data(), T, d->hidden, qkv.data(), qkv_n, false);
    agrt_rope_store(qkv.data(), T, d->heads, d->kv_heads, d->head_dim, pos, cos_t, sin_t, slots,
                    k_caches[i], v_caches[i], q.data());
    agrt_attention(q.data(), k_caches[i], v_caches[i], page_table, max_pages, cu_q, kv_lens, seqs,
                   nseq, d->heads, d->kv_heads, d->head_dim, d->page_size, d->scale, att.data());
    linear(L.o, att.data(), T, hd, x, d->hidden, true);
    agrt_rmsnorm(x, T, d->hidden, d->hidden, L.mlp_norm, d->eps, h.data());
    linear(L.gate_up, h.data(), T, d->hidden, gu.data(), 2LL * d->inter, false);
    agrt_silu_mul(gu.data(), T, d->inter, act.data());
    linear(L.down, act.data(), T, d->inter, x, d->hidden, true);
  }
}
