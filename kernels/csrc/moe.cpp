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

// Whether the experts' GEMMs run as one group (qgemm_group): a few rows each (tile-major in
// qgemm_rows too), plain parts (no precise pass, no bias).
bool grouped(const AgrtMoe& m, const std::vector<int64_t>& start) {
  if (start.back() > 256) return false;
  for (int e = 0; e < m.n_experts; ++e) {
    if (start[e + 1] - start[e] > 64) return false;
    for (const AgrtLinear* l : {&m.gate_up[e], &m.down[e]})
      if (l->precise || l->bias) return false;
  }
  return true;
}

// One job per part of each routed expert's linear `ls[e]`: its rows of x (ld ldx) into y (ld ldy).
void add_jobs(std::vector<agrt::GemmJob>& jobs, const AgrtLinear* ls, const std::vector<int64_t>& start,
              const float* x, int64_t ldx, float* y, int64_t ldy) {
  for (size_t e = 0; e + 1 < start.size(); ++e) {
    const int64_t a = start[e], n = start[e + 1] - a;
    int64_t off = 0;
    for (int j = 0; n > 0 && j < ls[e].nparts; ++j) {
      jobs.push_back({x + a * ldx, n, ldx, &ls[e].parts[j], y + a * ldy + off, ldy});
      off += ls[e].parts[j].n;
    }
  }
}

// x[rows[r]] += rw[r] * y[r] for r < n
void add_rows(float* x, int64_t hidden, const int64_t* rows, const float* rw, const float* y, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    float* xr = x + rows[r] * hidden;
    const float* yr = y + r * hidden;
    for (int64_t c = 0; c < hidden; ++c) xr[c] += rw[r] * yr[c];
  }
}

// Decode: every routed row gathered (experts one after another), each projection of every
// expert in one qgemm_group, then the rows added in the same order as the per-expert loop.
void run_grouped(const AgrtMoe& m, const float* h, int64_t hidden, const std::vector<int64_t>& start,
                 const int64_t* rows, const float* rw, float* x) {
  const int64_t R = start.back(), I = m.inter;
  float* xg = agrt_scratch<float>(kSlotMoeX, (size_t)(R * hidden));
  float* gu = agrt_scratch<float>(kSlotMoeGu, (size_t)(R * 2 * I));
  float* act = agrt_scratch<float>(kSlotMoeAct, (size_t)(R * I));
  float* y = agrt_scratch<float>(kSlotMoeY, (size_t)(R * hidden));
  for (int64_t r = 0; r < R; ++r) std::memcpy(xg + r * hidden, h + rows[r] * hidden, hidden * sizeof(float));
  std::vector<agrt::GemmJob> jobs;
  add_jobs(jobs, m.gate_up, start, xg, hidden, gu, 2 * I);
  agrt::qgemm_group(jobs.data(), (int)jobs.size());
  agrt_silu_mul(gu, R, I, act);
  jobs.clear();
  add_jobs(jobs, m.down, start, act, I, y, hidden);
  agrt::qgemm_group(jobs.data(), (int)jobs.size());
  add_rows(x, hidden, rows, rw, y, R);
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
  if (grouped(*m, start)) {
    run_grouped(*m, h, hidden, start, rows, rw, x);
    return;
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
    add_rows(x, hidden, rows + a, rw + a, y, n);
  }
}
