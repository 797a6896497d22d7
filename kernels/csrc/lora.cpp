// Segmented LoRA over one step's rows (agentrt/adapters/apply.py is the torch fallback).
//
// The rows of a step form segments [r0, r1), each running one adapter (rows of the base model
// belong to none). For projection `proj` of layer `layer`, each segment adds, per LoRA part of
// its adapter, y[r, col + o] += sum_k t[r, k] * B[o, k] with t[r, k] = A[k, :] . x[r, :]:
// shrink, then expand, one job per (segment, part, block of rows), all jobs in one parallel loop
// (each streams its A and B once, contiguously: decode reads every adapter's bytes once). A and
// B are fp32 or bf16 (the adapter's own precision; the base may be quantized); B is stored
// transposed ([rank, out]) so the expand runs along output columns.
//
// Every row's numbers are fixed by that row alone (common.h's agrt_dot, in its fixed 64-lane order, the
// expand's sum over k in order): a row gets the same bits whatever else runs in the step, and
// on every CPU kind, as the rest of the kernels (docs/determinism.md).
#include "common.h"
#include "api.h"

namespace {

constexpr int64_t kLoraRows = 16;  // rows of a segment per job

// t[r, :] = A @ x[r] for the job's rows, A read once (rows inner)
template <typename W>
void shrink(const AgrtLoraPart& p, const float* x, int64_t ldx, int64_t rows, float* t) {
  const W* a = static_cast<const W*>(p.a);
  for (int32_t k = 0; k < p.rank; ++k)
    for (int64_t r = 0; r < rows; ++r) t[r * p.rank + k] = agrt_dot(a + (int64_t)k * p.n_in, x + r * ldx, p.n_in);
}

// y[r, :] += t[r, :] @ Bt for the job's rows: Bt's rows streamed in order into a row of sums
// (each column's sum over k in order), then added to y
template <typename W>
void expand(const AgrtLoraPart& p, const float* t, int64_t rows, float* y, int64_t ldy, float* acc) {
  const W* bt = static_cast<const W*>(p.b);
  const int64_t n = p.n_out;
  for (int64_t r = 0; r < rows; ++r) {
    const float* tr = t + r * p.rank;
    std::fill(acc, acc + n, 0.f);
    for (int32_t k = 0; k < p.rank; ++k) {
      const W* row = bt + (int64_t)k * n;
      int64_t o = 0;
#ifdef __AVX512F__
      const __m512 tk = _mm512_set1_ps(tr[k]);
      for (; o + 16 <= n; o += 16)
        _mm512_storeu_ps(acc + o, _mm512_add_ps(_mm512_loadu_ps(acc + o), _mm512_mul_ps(tk, agrt_load16(row + o))));
#endif
      for (; o < n; ++o) acc[o] += tr[k] * agrt_load_w(row, o);
    }
    float* yr = y + r * ldy + p.col;
    for (int64_t o = 0; o < n; ++o) yr[o] += acc[o];
  }
}

// one part of one segment over a block of at most kLoraRows of its rows
struct Job { const AgrtLoraPart* p; int64_t r0, rows; float* t; };

}  // namespace

extern "C" void agrt_lora(const AgrtLoraStep* st, int32_t layer, int32_t proj, const float* x, int64_t ldx,
                          float* y, int64_t ldy) {
  if (!st) return;
  std::vector<Job> jobs;
  int64_t floats = 0, widest = 1;
  for (int32_t s = 0; s < st->nseg; ++s) {
    const AgrtLoraSeg& g = st->segs[s];
    const AgrtAdapter* ad = g.adapter;
    if (layer >= ad->nlayers) continue;
    const int32_t at = layer * 4 + proj;
    for (int32_t i = ad->index[at]; i < ad->index[at + 1]; ++i)
      for (int64_t r = g.r0; r < g.r1; r += kLoraRows) {
        jobs.push_back({&ad->parts[i], r, std::min(kLoraRows, g.r1 - r), nullptr});
        floats += jobs.back().rows * ad->parts[i].rank;
        widest = std::max(widest, ad->parts[i].n_out);
      }
  }
  if (jobs.empty()) return;
  float* t = agrt_scratch<float>(kSlotLoraT, (size_t)floats);
  for (Job& jb : jobs) {
    jb.t = t;
    t += jb.rows * jb.p->rank;
  }
  const int64_t n = (int64_t)jobs.size();
#pragma omp parallel
  {
    float* acc = agrt_scratch<float>(kSlotLoraAcc, (size_t)widest);  // (each thread's own)
#pragma omp for schedule(dynamic, 1)
    for (int64_t j = 0; j < n; ++j) {  // (jobs write disjoint rows or columns of y: no barrier)
      const Job& jb = jobs[j];
      if (jb.p->bf16) {
        shrink<uint16_t>(*jb.p, x + jb.r0 * ldx, ldx, jb.rows, jb.t);
        expand<uint16_t>(*jb.p, jb.t, jb.rows, y + jb.r0 * ldy, ldy, acc);
      } else {
        shrink<float>(*jb.p, x + jb.r0 * ldx, ldx, jb.rows, jb.t);
        expand<float>(*jb.p, jb.t, jb.rows, y + jb.r0 * ldy, ldy, acc);
      }
    }
  }
}
