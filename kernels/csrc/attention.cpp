// Causal attention over the paged KV cache (float or IEEE half) for decode and prefill rows,
// one call per layer.
#include "common.h"
#include "api.h"

namespace {

inline float dot(const float* a, const float* b, int n) {
#ifdef __AVX512F__
  if (n % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

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

// y[0..n) += a * x
inline void axpy(float a, const float* x, float* y, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// The keys 0..n-1 of one sequence and KV head: slot j lives in page pt[j / S] at row j % S.
// T: the cache's element type (float, or IEEE half as uint16_t).
template <typename T>
struct Keys {
  const T* k; const T* v; const int64_t* pt;
  int64_t S, row_stride, head_off, n;
  // fn(j, row of key/value j) for j = 0..n-1, page by page (no division per key)
  template <typename Fn>
  void each(const T* cache, Fn&& fn) const {
    for (int64_t j0 = 0, pi = 0; j0 < n; j0 += S, ++pi) {
      const T* base = cache + pt[pi] * S * row_stride + head_off;
      const int64_t cnt = std::min<int64_t>(S, n - j0);
      for (int64_t o = 0; o < cnt; ++o) fn(j0 + o, base + o * row_stride);
    }
  }
};

// a cache row as floats: itself, or converted into `buf`
inline const float* kv_row(const float* r, int, float*) { return r; }
inline const float* kv_row(const uint16_t* r, int D, float* buf) {
  for (int i = 0; i < D; ++i) buf[i] = agrt_half_to_float(r[i]);
  return buf;
}

template <typename T>
void attend_generic(const float* qg, int group, int D, const Keys<T>& ks, float scale, float* sc,
                    float* og, float* row) {
  const int64_t n = ks.n;
  ks.each(ks.k, [&](int64_t j, const T* kr) {
    const float* kf = kv_row(kr, D, row);
    for (int g = 0; g < group; ++g) sc[g * n + j] = dot(qg + g * D, kf, D) * scale;
  });
  for (int g = 0; g < group; ++g) softmax_inplace(sc + g * n, n);
  std::fill(og, og + group * D, 0.f);
  ks.each(ks.v, [&](int64_t j, const T* vr) {
    const float* vf = kv_row(vr, D, row);
    for (int g = 0; g < group; ++g) axpy(sc[g * n + j], vf, og + g * D, D);
  });
}

#ifdef __AVX512F__
// D = 16 * NV. Query heads in blocks of HB whose queries (scores pass) and outputs (values
// pass) stay in registers: each key/value row is loaded once per block, and no accumulator
// goes through memory between keys.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }

template <int NV, typename T>
void attend_avx(const float* qg, int group, const Keys<T>& ks, float scale, float* sc, float* og) {
  constexpr int HB = 16 / NV, D = 16 * NV;
  const int64_t n = ks.n;
  for (int g0 = 0; g0 < group; g0 += HB) {
    const int hb = std::min(HB, group - g0);
    __m512 qv[HB][NV];
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < NV; ++c)
        qv[h][c] = h < hb ? _mm512_mul_ps(_mm512_loadu_ps(qg + (g0 + h) * D + 16 * c), _mm512_set1_ps(scale))
                          : _mm512_setzero_ps();
    ks.each(ks.k, [&](int64_t j, const T* kr) {
      __m512 kv[NV];
      for (int c = 0; c < NV; ++c) kv[c] = load16(kr + 16 * c);
      for (int h = 0; h < hb; ++h) {
        __m512 a = _mm512_mul_ps(qv[h][0], kv[0]);
        for (int c = 1; c < NV; ++c) a = _mm512_fmadd_ps(qv[h][c], kv[c], a);
        sc[(g0 + h) * n + j] = _mm512_reduce_add_ps(a);
      }
    });
    for (int h = 0; h < hb; ++h) softmax_inplace(sc + (g0 + h) * n, n);
    __m512 acc[HB][NV];
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < NV; ++c) acc[h][c] = _mm512_setzero_ps();
    ks.each(ks.v, [&](int64_t j, const T* vr) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = load16(vr + 16 * c);
      for (int h = 0; h < hb; ++h) {
        const __m512 p = _mm512_set1_ps(sc[(g0 + h) * n + j]);
        for (int c = 0; c < NV; ++c) acc[h][c] = _mm512_fmadd_ps(p, vv[c], acc[h][c]);
      }
    });
    for (int h = 0; h < hb; ++h)
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(og + (g0 + h) * D + 16 * c, acc[h][c]);
  }
}
#endif

constexpr int64_t kRowsPerTask = 4;

struct AttnArgs {
  const float* q; const int64_t* page_table; int64_t max_pages; const int64_t* cu_q;
  const int64_t* kv_lens; const int64_t* seqs; int64_t nseq; int32_t H, Hkv, D, S; float scale;
  float* out;
};

// One task = up to kRowsPerTask query rows of a sequence x one KV head, with the H/Hkv query
// heads that share it: each key and value row is loaded once for the whole group, and the
// task's later rows find the sequence's K/V in cache (speculation verify steps bring several
// rows per sequence over long contexts).
template <typename T>
void attention(const AttnArgs& a, const T* k_cache, const T* v_cache) {
  int64_t* first = agrt_scratch<int64_t>(kSlotTasks, (size_t)(a.nseq + 1));
  first[0] = 0;
  for (int64_t i = 0; i < a.nseq; ++i) {
    const int64_t b = a.seqs[i];
    first[i + 1] = first[i] + (a.cu_q[b + 1] - a.cu_q[b] + kRowsPerTask - 1) / kRowsPerTask * a.Hkv;
  }
  const int group = a.H / a.Hkv, D = a.D;
#pragma omp parallel for schedule(static) if (first[a.nseq] > 1)
  for (int64_t task = 0; task < first[a.nseq]; ++task) {
    const int64_t i = std::upper_bound(first, first + a.nseq + 1, task) - first - 1;
    const int64_t b = a.seqs[i], local = task - first[i];
    const int64_t q0 = local / a.Hkv * kRowsPerTask, hk = local % a.Hkv;
    const int64_t qlen = a.cu_q[b + 1] - a.cu_q[b];
    for (int64_t qi = q0; qi < std::min<int64_t>(q0 + kRowsPerTask, qlen); ++qi) {
      const int64_t row = a.cu_q[b] + qi, n = a.kv_lens[b] - qlen + qi + 1;  // keys 0..n-1
      const float* qg = a.q + (row * a.H + hk * group) * D;  // the group's query heads, contiguous
      float* og = a.out + (row * a.H + hk * group) * D;
      float* sc = agrt_scratch<float>(kSlotScores, (size_t)(n * group));
      const Keys<T> keys{k_cache, v_cache, a.page_table + b * a.max_pages, a.S, (int64_t)a.Hkv * D, hk * D, n};
#ifdef __AVX512F__
      if (D == 64) {
        attend_avx<4>(qg, group, keys, a.scale, sc, og);
        continue;
      }
      if (D == 128) {
        attend_avx<8>(qg, group, keys, a.scale, sc, og);
        continue;
      }
#endif
      attend_generic(qg, group, D, keys, a.scale, sc, og, agrt_scratch<float>(kSlotKvRow, (size_t)D));
    }
  }
}

}  // namespace

extern "C" {

// Causal attention over paged KV (float, or IEEE half when kv_half) for the sequences listed in
// seqs[nseq]: sequence b has q_len = cu_q[b+1] - cu_q[b] queries (rows cu_q[b].. of q [T, H, D])
// at the last q_len of its kv_lens[b] positions, whose pages are page_table[b, :]. Writes the
// same rows of out [T, H, D].
void agrt_attention(const float* q, const void* k_cache, const void* v_cache,
                    const int64_t* page_table, int64_t max_pages, const int64_t* cu_q,
                    const int64_t* kv_lens, const int64_t* seqs, int64_t nseq, int32_t H,
                    int32_t Hkv, int32_t D, int32_t S, float scale, float* out, int32_t kv_half) {
  const AttnArgs a{q, page_table, max_pages, cu_q, kv_lens, seqs, nseq, H, Hkv, D, S, scale, out};
  if (kv_half)
    attention(a, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache));
  else
    attention(a, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache));
}

}  // extern "C"
