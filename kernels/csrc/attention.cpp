// Causal attention over the paged KV cache (float or IEEE half) for every query row of a step:
// decode, speculation verify and prefill chunks of any length, one call per layer.
//
// Batch invariance: a row's result is a function of its query, its key count n and the cache's
// contents only. Its arithmetic is fixed: scores in blocks of 16 keys from key 0 (one fma chain
// over the head dimension per key, then one 16-way butterfly sum), a softmax whose reductions
// run in 16-lane blocks from key 0, and the values summed key by key from key 0. Which rows share
// a task, how many rows the chunk or batch holds, and how the work is split over threads only
// decide which rows share the loads of a key block: never the order of any row's sums. So a
// prompt gives the same numbers cold, after a radix hit, chunked any way, batched with anything,
// and verified as a draft (tests/test_invariance.py).
//
// Sliding window (window > 0): a row with n keys attends keys [n - window, n). Its sums start at
// the 16-aligned block holding key n - window, the keys before n - window there scored -inf
// (probability exactly 0): adding exact zeros changes no sum, so the result is the same as a
// scan from key 0 with those keys masked, and still a function of the row alone.
#include <omp.h>

#include "common.h"
#include "api.h"

namespace {

// x[0..n) <- softmax(x)
inline void softmax_inplace(float* x, int64_t n) {
  float mx = -INFINITY;
  int64_t j = 0;
#ifdef __AVX512F__
  __m512 mvec = _mm512_set1_ps(-INFINITY);
  for (; j + 16 <= n; j += 16) mvec = _mm512_max_ps(mvec, _mm512_loadu_ps(x + j));
  mx = _mm512_reduce_max_ps(mvec);
#endif
  for (; j < n; ++j) mx = std::max(mx, x[j]);
  float total = 0.f;
  j = 0;
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(x + j), mv));
    _mm512_storeu_ps(x + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; j < n; ++j) {
    x[j] = std::exp(x[j] - mx);
    total += x[j];
  }
  const float inv = 1.f / total;
  for (int64_t k = 0; k < n; ++k) x[k] *= inv;
}

constexpr int64_t kBlock = 16;  // keys per score block

// One task's rows: rows r0..r0+nr-1 of sequence b (its queries qi0..), all query heads of one
// KV head. n(r) = keys row r attends to; sc: [nr][group][nmax] scores then probabilities.
template <typename T>
struct Task {
  const T* k; const T* v; const int64_t* pt;  // caches; the sequence's page table
  int64_t S, row_stride, head_off;           // page size; cache row stride; this KV head's offset
  const float* q; float* out; int64_t ldq;     // rows' first query head / output; row stride
  int64_t n0, nr, nmax;                        // keys of the first row; rows; keys of the last
  int group, D; float scale; float* sc;
  int64_t window;                              // sliding window (0: none)
  float softcap;                               // scores -> softcap * tanh(scores / softcap) (0: none)
  int64_t n(int64_t r) const { return n0 + r; }
  int64_t cut(int64_t r) const { return window > 0 ? std::max<int64_t>(0, n(r) - window) : 0; }  // first key
  int64_t start(int64_t r) const { return cut(r) / 16 * 16; }  // its block (kBlock = 16)
  const T* row(const T* cache, int64_t j) const {
    return cache + pt[j / S] * S * row_stride + (j % S) * row_stride + head_off;
  }
  float* scores(int64_t r, int h) const { return sc + (r * group + h) * nmax; }
};

inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return agrt_half_to_float(x); }

#ifdef __AVX512F__
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
#endif

// keys [j0, j0 + 16) as floats in kf[16][D] (rows past nmax: zeros)
template <typename T>
void key_block(const Task<T>& t, int64_t j0, float* kf) {
  for (int64_t i = 0; i < kBlock; ++i) {
    float* dst = kf + i * t.D;
    if (j0 + i >= t.nmax) {
      std::fill(dst, dst + t.D, 0.f);
      continue;
    }
    const T* src = t.row(t.k, j0 + i);
    int d = 0;
#ifdef __AVX512F__
    for (; d + 16 <= t.D; d += 16) _mm512_storeu_ps(dst + d, load16(src + d));
#endif
    for (; d < t.D; ++d) dst[d] = to_float(src[d]);
  }
}

#ifdef __AVX512F__
// The 16 horizontal sums of v[0..16): lane 4m+k of the result is the sum of v[4k+m]'s lanes
// (the slot order of score_block makes that key 4m+k), in one fixed tree of additions.
inline __m512 hsum16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

// scores of one query head (qs: query * scale) against the 16 keys of kf, lane i = key i
template <int NV>
inline __m512 score_block(const __m512* qs, const float* kf) {
  constexpr int D = 16 * NV;
  __m512 v[16];
#pragma GCC unroll 16
  for (int s = 0; s < 16; ++s) {
    const float* kr = kf + (4 * (s & 3) + (s >> 2)) * D;
    __m512 a = _mm512_mul_ps(qs[0], _mm512_loadu_ps(kr));
#pragma GCC unroll 8
    for (int c = 1; c < NV; ++c) a = _mm512_fmadd_ps(qs[c], _mm512_loadu_ps(kr + 16 * c), a);
    v[s] = a;
  }
  return hsum16(v);
}

template <int NV, typename T>
void scores_avx(const Task<T>& t, float* kf) {
  for (int64_t j0 = t.start(0); j0 < t.nmax; j0 += kBlock) {
    key_block(t, j0, kf);
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t live = std::min<int64_t>(kBlock, t.n(r) - j0);
      if (live <= 0 || j0 < t.start(r)) continue;
      const __mmask16 mask = (__mmask16)((1u << live) - 1u);
      for (int h = 0; h < t.group; ++h) {
        const float* qh = t.q + r * t.ldq + h * t.D;
        __m512 qs[NV];
        for (int c = 0; c < NV; ++c) qs[c] = _mm512_mul_ps(_mm512_loadu_ps(qh + 16 * c), _mm512_set1_ps(t.scale));
        _mm512_mask_storeu_ps(t.scores(r, h) + j0, mask, score_block<NV>(qs, kf));
      }
    }
  }
}

// out[u] = sum_j p[u][j] * v_j over keys [j0, j1) for U (row, head) units, each value row
// loaded once for all of them; acc starts from out (the units' earlier keys) when `resume`.
template <int NV, int U, typename T>
void values_units(const Task<T>& t, const int64_t* ur, const int* uh, int64_t j0, int64_t j1, bool resume) {
  __m512 acc[U][NV];
  const float* p[U];
  float* o[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    p[u] = t.scores(ur[u], uh[u]);
    o[u] = t.out + ur[u] * t.ldq + uh[u] * t.D;
    for (int c = 0; c < NV; ++c) acc[u][c] = resume ? _mm512_loadu_ps(o[u] + 16 * c) : _mm512_setzero_ps();
  }
  for (int64_t j = j0; j < j1; ++j) {
    const T* vr = t.row(t.v, j);
    __m512 vv[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) vv[c] = load16(vr + 16 * c);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const __m512 pj = _mm512_set1_ps(p[u][j]);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) acc[u][c] = _mm512_fmadd_ps(pj, vv[c], acc[u][c]);
    }
  }
  for (int u = 0; u < U; ++u)
    for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o[u] + 16 * c, acc[u][c]);
}

// values_units for cnt <= U units (a template per count: accumulators stay in registers)
template <int NV, int U, typename T>
void values_some(const Task<T>& t, int cnt, const int64_t* ur, const int* uh, int64_t j0, int64_t j1) {
  if constexpr (U > 1) {
    if (cnt < U) return values_some<NV, U - 1>(t, cnt, ur, uh, j0, j1);
  }
  values_units<NV, U>(t, ur, uh, j0, j1, false);
}

// Units in groups of U share each value row up to the group's fewest keys; each then finishes
// its own keys alone. Every unit's sum runs key by key from key 0 either way.
template <int NV, int U, typename T>
void values_avx(const Task<T>& t) {
  const int64_t nu = t.nr * t.group;
  for (int64_t u0 = 0; u0 < nu; u0 += U) {
    const int cnt = (int)std::min<int64_t>(U, nu - u0);
    int64_t ur[U];
    int uh[U];
    for (int i = 0; i < U; ++i) {
      const int64_t u = u0 + std::min(i, cnt - 1);  // (a short group repeats its last unit)
      ur[i] = u / t.group, uh[i] = (int)(u % t.group);
    }
    const int64_t shared = t.n(ur[0]);  // units are row-major: the first row has the fewest keys
    values_some<NV, U>(t, cnt, ur, uh, t.start(0), shared);
    for (int i = 0; i < cnt; ++i)
      if (t.n(ur[i]) > shared) values_units<NV, 1>(t, ur + i, uh + i, shared, t.n(ur[i]), true);
  }
}
#endif

// The portable loops: the same order of sums (blocks of 16 keys, lanes summed by the same tree).
template <typename T>
void scores_generic(const Task<T>& t, float* kf) {
  float lanes[16][16];
  for (int64_t j0 = t.start(0); j0 < t.nmax; j0 += kBlock) {
    key_block(t, j0, kf);
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t live = j0 < t.start(r) ? 0 : std::min<int64_t>(kBlock, t.n(r) - j0);
      for (int h = 0; h < t.group && live > 0; ++h) {
        const float* qh = t.q + r * t.ldq + h * t.D;
        for (int64_t i = 0; i < live; ++i) {
          for (int l = 0; l < 16; ++l) lanes[i][l] = 0.f;  // (D < 16: the lanes past D stay 0)
          for (int d = 0; d < t.D; ++d) {  // lane d % 16: a product, then fused multiply-adds
            const float qd = qh[d] * t.scale, kd = kf[i * t.D + d];
            lanes[i][d % 16] = d < 16 ? qd * kd : std::fma(qd, kd, lanes[i][d % 16]);
          }
          float a[8];
          for (int l = 0; l < 8; ++l) a[l] = lanes[i][l] + lanes[i][l + 8];
          float b[4] = {a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]};
          t.scores(r, h)[j0 + i] = (b[0] + b[2]) + (b[1] + b[3]);
        }
      }
    }
  }
}

template <typename T>
void values_generic(const Task<T>& t) {
  for (int64_t r = 0; r < t.nr; ++r)
    for (int h = 0; h < t.group; ++h) {
      float* o = t.out + r * t.ldq + h * t.D;
      const float* p = t.scores(r, h);
      std::fill(o, o + t.D, 0.f);
      for (int64_t j = t.start(r); j < t.n(r); ++j) {
        const T* vr = t.row(t.v, j);
        for (int d = 0; d < t.D; ++d) o[d] = std::fma(p[j], to_float(vr[d]), o[d]);
      }
    }
}

template <typename T>
void run_task(const Task<T>& t) {
  float* kf = agrt_scratch<float>(kSlotKvRow, (size_t)(kBlock * t.D));
#ifdef __AVX512F__
  if (t.D == 64) {
    scores_avx<4>(t, kf);
  } else if (t.D == 128) {
    scores_avx<8>(t, kf);
  } else if (t.D == 256) {  // (Gemma)
    scores_avx<16>(t, kf);
  } else {
    scores_generic(t, kf);
  }
#else
  scores_generic(t, kf);
#endif
  for (int64_t r = 0; r < t.nr; ++r)
    for (int h = 0; h < t.group; ++h) {
      float* p = t.scores(r, h);
      if (t.softcap > 0.f)  // (Gemma 2: before the mask, as its reference does)
        for (int64_t j = t.cut(r); j < t.n(r); ++j) p[j] = t.softcap * std::tanh(p[j] / t.softcap);
      std::fill(p + t.start(r), p + t.cut(r), -INFINITY);  // (in the window's first block)
      softmax_inplace(p + t.start(r), t.n(r) - t.start(r));
      std::fill(p + t.start(0), p + t.start(r), 0.f);  // (rows sharing value loads from start(0))
    }
#ifdef __AVX512F__
  if (t.D == 64) return values_avx<4, 6>(t);
  if (t.D == 128) return values_avx<8, 3>(t);
  if (t.D == 256) return values_avx<16, 1>(t);
#endif
  values_generic(t);
}

constexpr int64_t kRowsPerTask = 16;  // rows sharing each key block's loads (not their sums)

struct AttnArgs {
  const float* q; const int64_t* page_table; int64_t max_pages; const int64_t* cu_q;
  const int64_t* kv_lens; const int64_t* seqs; int64_t nseq; int32_t H, Hkv, D, S; float scale;
  float* out; int64_t window; float softcap;
};

// One task = up to kRowsPerTask query rows of a sequence x one KV head, with the H/Hkv query
// heads that share it (all of them, or a share of them when there are fewer tasks than threads:
// a decode step of a model with one KV head, Gemma's, is otherwise one task). Tasks go to threads
// round-robin (a causal chunk's later rows cost more). No row's sums depend on the split.
template <typename T>
void attention(const AttnArgs& a, const T* k_cache, const T* v_cache) {
  int64_t* first = agrt_scratch<int64_t>(kSlotTasks, (size_t)(a.nseq + 1));
  first[0] = 0;
  for (int64_t i = 0; i < a.nseq; ++i) {
    const int64_t b = a.seqs[i];
    first[i + 1] = first[i] + (a.cu_q[b + 1] - a.cu_q[b] + kRowsPerTask - 1) / kRowsPerTask * a.Hkv;
  }
  const int group = a.H / a.Hkv, threads = omp_get_max_threads();
  int split = 1;  // query-head shares per KV head
  while (first[a.nseq] * split < threads && group % (split * 2) == 0) split *= 2;
  const int sub = group / split;
  const int64_t ntasks = first[a.nseq] * split;
#pragma omp parallel for schedule(static, 1) if (ntasks > 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int64_t i = std::upper_bound(first, first + a.nseq + 1, task / split) - first - 1;
    const int64_t b = a.seqs[i], local = task - first[i] * split;
    const int64_t q0 = local / (a.Hkv * split) * kRowsPerTask, hk = local / split % a.Hkv;
    const int64_t head0 = hk * group + local % split * sub;  // this task's first query head
    const int64_t qlen = a.cu_q[b + 1] - a.cu_q[b], nr = std::min<int64_t>(kRowsPerTask, qlen - q0);
    const int64_t n0 = a.kv_lens[b] - qlen + q0 + 1, row0 = a.cu_q[b] + q0;  // row q0 sees keys 0..n0-1
    float* sc = agrt_scratch<float>(kSlotScores, (size_t)(nr * sub * (n0 + nr - 1)));
    const Task<T> t{k_cache, v_cache, a.page_table + b * a.max_pages, a.S, (int64_t)a.Hkv * a.D,
                    hk * a.D, a.q + (row0 * a.H + head0) * a.D, a.out + (row0 * a.H + head0) * a.D,
                    (int64_t)a.H * a.D, n0, nr, n0 + nr - 1, sub, a.D, a.scale, sc, a.window, a.softcap};
    run_task(t);
  }
}

}  // namespace

extern "C" {

// Causal attention over paged KV (float, or IEEE half when kv_half) for the sequences listed in
// seqs[nseq]: sequence b has q_len = cu_q[b+1] - cu_q[b] queries (rows cu_q[b].. of q [T, H, D])
// at the last q_len of its kv_lens[b] positions, whose pages are page_table[b, :]. Writes the
// same rows of out [T, H, D]. window > 0: each query attends its last `window` keys only;
// softcap > 0: scores pass through softcap * tanh(score / softcap) before the softmax.
void agrt_attention(const float* q, const void* k_cache, const void* v_cache,
                    const int64_t* page_table, int64_t max_pages, const int64_t* cu_q,
                    const int64_t* kv_lens, const int64_t* seqs, int64_t nseq, int32_t H,
                    int32_t Hkv, int32_t D, int32_t S, float scale, float* out, int32_t kv_half,
                    int32_t window, float softcap) {
  const AttnArgs a{q, page_table, max_pages, cu_q, kv_lens, seqs, nseq, H, Hkv, D, S, scale, out, window,
                   softcap};
  if (kv_half)
    attention(a, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache));
  else
    attention(a, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache));
}

}  // extern "C"
