// Mixture-of-experts MLP (agentrt/model/moe.py): x += sum over each row's top-k experts of
// weight * expert(h). Routing (fp32 router logits, softmax, top-k, optional renormalisation)
// runs per row; then each expert gathers the rows routed to it and runs its quantized GEMMs once
// for all of them (the grouped GEMM: an expert's weights are read once per call, whatever the
// number of its rows; experts no row chose are not read at all). Each row adds its experts'
// outputs in ascending expert order, so a row's result does not depend on the batch.
#include <vector>

#include "common.h"
#include "api.h"

namespace {

constexpr int kMaxExperts = 1024;

float dot(const float* a, const float* b, int64_t n) {  // a fixed order for every row
  float s = 0.f;
  int64_t i = 0;
#ifdef __AVX512F__
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  s = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// ids[t * k + j], w[t * k + j]: row t's j-th expert (largest probability first) and its weight
void route(const AgrtMoe& m, const float* h, int64_t T, int64_t hidden, int32_t* ids, float* w) {
  const int E = m.n_experts, K = m.top_k;
#pragma omp parallel for schedule(static) if (T * E * hidden > (1 << 18))
  for (int64_t t = 0; t < T; ++t) {
    float p[kMaxExperts];
    float mx = -INFINITY, sum = 0.f;
    for (int e = 0; e < E; ++e) {
      p[e] = dot(h + t * hidden, m.router + (int64_t)e * hidden, hidden);
      mx = std::max(mx, p[e]);
    }
    for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(p[e] - mx));
    float chosen = 0.f;
    for (int j = 0; j < K; ++j) {  // selection: the largest left (ties: the lowest id)
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (p[e] >= 0.f && (best < 0 || p[e] > p[best])) best = e;
      ids[t * K + j] = best;
      w[t * K + j] = p[best] / sum;
      chosen += w[t * K + j];
      p[best] = -1.f;  // (probabilities are >= 0: taken)
    }
    if (m.norm_topk)
      for (int j = 0; j < K; ++j) w[t * K + j] /= chosen;
  }
}

}  // namespace

extern "C" void agrt_moe(const AgrtMoe* m, const float* h, int64_t T, int64_t hidden, float* x) {
  if (T <= 0 || m->n_experts > kMaxExperts) return;  // (moe.py refuses more experts at load)
  const int E = m->n_experts, K = m->top_k;
  const int64_t I = m->inter;
  int32_t* ids = agrt_scratch<int32_t>(kSlotMoeRoute, (size_t)(2 * T * K));
  float* w = reinterpret_cast<float*>(ids + T * K);
  route(*m, h, T, hidden, ids, w);
  // each expert's rows (ascending) and their weights, experts one after another
  std::vector<int64_t> start(E + 1, 0);
  for (int64_t i = 0; i < T * K; ++i) ++start[ids[i] + 1];
  for (int e = 0; e < E; ++e) start[e + 1] += start[e];
  int64_t* rows = agrt_scratch<int64_t>(kSlotMoeRows, (size_t)(2 * T * K));
  float* rw = reinterpret_cast<float*>(rows + T * K);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int64_t at = fill[ids[t * K + j]]++;
      rows[at] = t;
      rw[at] = w[t * K + j];
    }
  int64_t most = 0;
  for (int e = 0; e < E; ++e) most = std::max(most, start[e + 1] - start[e]);
  float* xg = agrt_scratch<float>(kSlotMoeX, (size_t)(most * hidden));
  float* gu = agrt_scratch<float>(kSlotMoeGu, (size_t)(most * 2 * I));
  float* act = agrt_scratch<float>(kSlotMoeAct, (size_t)(most * I));
  float* y = agrt_scratch<float>(kSlotMoeY, (size_t)(most * hidden));
  for (int e = 0; e < E; ++e) {
    const int64_t a = start[e], n = start[e + 1] - a;
    if (n == 0) continue;
    for (int64_t r = 0; r < n; ++r) std::memcpy(xg + r * hidden, h + rows[a + r] * hidden, hidden * sizeof(float));
    agrt::linear(m->gate_up[e], xg, n, hidden, gu, 2 * I, false);
    agrt_silu_mul(gu, n, I, act);
    agrt::linear(m->down[e], act, n, I, y, hidden, false);
    for (int64_t r = 0; r < n; ++r) {
      float* xr = x + rows[a + r] * hidden;
      const float* yr = y + r * hidden;
      const float wr = rw[a + r];
      for (int64_t c = 0; c < hidden; ++c) xr[c] += wr * yr[c];
    }
  }
}
