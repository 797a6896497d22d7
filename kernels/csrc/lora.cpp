// Segmented LoRA over one step's rows (agentrt/adapters/apply.py is the torch fallback).
//
// The rows of a step form segments [r0, r1), each running one adapter (rows of the base model
// belong to none). For projection `proj` of layer `layer`, each segment adds, per LoRA part of
// its adapter, y[r, col + o] += sum_k t[r, k] * B[o, k] with t[r, k] = A[k, :] . x[r, :]:
// shrink, then expand, one job per (segment, part, block of rows), all jobs in one parallel loop
// (each streams its A and B once, contiguously: decode reads every adapter's bytes once). A and B are fp32 or bf16 (the adapter's own precision; the base may
// be quantized); B is stored transposed ([rank, out]) so the expand runs along output columns.
//
// Every row's numbers are fixed by that row alone (a dot in agrt_sumsq's fixed 64-lane order, the
// expand's sum over k in order): a row gets the same bits whatever else runs in the step, and
// on every CPU kind, as the rest of the kernels (docs/determinism.md).
#include "common.h"
#include "api.h"

namespace {

constexpr int64_t kLoraRows = 16;  // rows of a segment per job

inline float load_w(const float* p, int64_t i) { return p[i]; }
inline float load_w(const uint16_t* p, int64_t i) {  // bf16: the top half of a float, exactly
  const uint32_t bits = (uint32_t)p[i] << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {  // 16 bf16 values, widened exactly
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif

// a . x over n values in a fixed order: 64 running sums (sum j takes i = j mod 64 below the last
// whole 64), folded pairwise (+32, +16, ..., +1), then the rest in order; no FMA (agrt_sumsq's
// order: the AVX-512 and the portable loops give the same bits).
template <typename W>
float dot(const W* a, const float* x, int64_t n) {
  constexpr int kLanes = 64;
  int64_t i = 0;
  float s;
#ifdef __AVX512F__
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (; i + kLanes <= n; i += kLanes)
    for (int r = 0; r < 4; ++r)
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(load16(a + i + 16 * r), _mm512_loadu_ps(x + i + 16 * r)));
  s = agrt_fold64(acc);
#else
  float lane[kLanes] = {};
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += load_w(a, i + j) * x[i + j];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  s = lane[0];
#endif
  for (; i < n; ++i) s += load_w(a, i) * x[i];
  return s;
}

// t[r, :] = A @ x[r] for the job's rows, A read once (rows inner)
template <typename W>
void shrink(const AgrtLoraPart& p, const float* x, int64_t ldx, int64_t rows, float* t) {
  const W* a = static_cast<const W*>(p.a);
  for (int32_t k = 0; k < p.rank; ++k)
    for (int64_t r = 0; r < rows; ++r) t[r * p.rank + k] = dot(a + (int64_t)k * p.n_in, x + r * ldx, p.n_in);
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
        _mm512_storeu_ps(acc + o, _mm512_add_ps(_mm512_loadu_ps(acc + o), _mm512_mul_ps(tk, load16(row + o))));
#endif
      for (; o < n; ++o) acc[o] += tr[k] * load_w(row, o);
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
