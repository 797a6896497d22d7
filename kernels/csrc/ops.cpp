// Fused elementwise and attention kernels of one decoder layer (fp32), one call each.
// They replace chains of small torch ops whose per-op dispatch cost dominated a decode step.
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

#ifdef __AVX512F__
// e^x for x <= 0 (softmax after subtracting the max): 2^n * 2^f, degree-7 Taylor for 2^f,
// |f| <= 1/2, relative error ~1e-7 (torch's softmax uses a vectorized approximation too).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718f));
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

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

// out[0..D) <- one head of x, RMS-normalised with weight w first when w is set (Qwen3's q/k
// norm: same formula as agrt_rmsnorm), then rotated in place (rotate-half layout).
inline void norm_rope_row(const float* x, const float* w, float eps, const float* c, const float* s,
                          int D, float* out) {
  if (w != nullptr) {
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < D; ++i) ss += x[i] * x[i];
    const float r = 1.f / std::sqrt(ss / (float)D + eps);
    for (int i = 0; i < D; ++i) out[i] = x[i] * r * w[i];
  } else {
    std::memcpy(out, x, sizeof(float) * D);
  }
  const int half = D / 2;
#pragma omp simd
  for (int i = 0; i < half; ++i) {
    const float a = out[i], b = out[i + half];
    out[i] = a * c[i] - b * s[i];
    out[i + half] = b * c[i + half] + a * s[i + half];
  }
}

// The keys 0..n-1 of one sequence and KV head: slot j lives in page pt[j / S] at row j % S.
struct Keys {
  const float* k; const float* v; const int64_t* pt;
  int64_t S, row_stride, head_off, n;
  // fn(j, row of key/value j) for j = 0..n-1, page by page (no division per key)
  template <typename Fn>
  void each(const float* cache, Fn&& fn) const {
    for (int64_t j0 = 0, pi = 0; j0 < n; j0 += S, ++pi) {
      const float* base = cache + pt[pi] * S * row_stride + head_off;
      const int64_t cnt = std::min<int64_t>(S, n - j0);
      for (int64_t o = 0; o < cnt; ++o) fn(j0 + o, base + o * row_stride);
    }
  }
};

void attend_generic(const float* qg, int group, int D, const Keys& ks, float scale, float* sc,
                    float* og) {
  const int64_t n = ks.n;
  ks.each(ks.k, [&](int64_t j, const float* kr) {
    for (int g = 0; g < group; ++g) sc[g * n + j] = dot(qg + g * D, kr, D) * scale;
  });
  for (int g = 0; g < group; ++g) softmax_inplace(sc + g * n, n);
  std::fill(og, og + group * D, 0.f);
  ks.each(ks.v, [&](int64_t j, const float* vr) {
    for (int g = 0; g < group; ++g) axpy(sc[g * n + j], vr, og + g * D, D);
  });
}

#ifdef __AVX512F__
// D = 16 * NV. Query heads in blocks of HB whose queries (scores pass) and outputs (values
// pass) stay in registers: each key/value row is loaded once per block, and no accumulator
// goes through memory between keys.
template <int NV>
void attend_avx(const float* qg, int group, const Keys& ks, float scale, float* sc, float* og) {
  constexpr int HB = 16 / NV, D = 16 * NV;
  const int64_t n = ks.n;
  for (int g0 = 0; g0 < group; g0 += HB) {
    const int hb = std::min(HB, group - g0);
    __m512 qv[HB][NV];
    for (int h = 0; h < HB; ++h)
      for (int c = 0; c < NV; ++c)
        qv[h][c] = h < hb ? _mm512_mul_ps(_mm512_loadu_ps(qg + (g0 + h) * D + 16 * c), _mm512_set1_ps(scale))
                          : _mm512_setzero_ps();
    ks.each(ks.k, [&](int64_t j, const float* kr) {
      __m512 kv[NV];
      for (int c = 0; c < NV; ++c) kv[c] = _mm512_loadu_ps(kr + 16 * c);
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
    ks.each(ks.v, [&](int64_t j, const float* vr) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = _mm512_loadu_ps(vr + 16 * c);
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

}  // namespace

extern "C" {

// out[T, Dm] = x * rsqrt(mean(x^2) + eps) * w; x rows have stride ldx.
void agrt_rmsnorm(const float* x, int64_t T, int64_t Dm, int64_t ldx, const float* w, float eps,
                  float* out) {
#pragma omp parallel for schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * ldx;
    float ss = 0.f;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < Dm; ++i) ss += xr[i] * xr[i];
    const float r = 1.f / std::sqrt(ss / (float)Dm + eps);
    float* o = out + t * Dm;
#pragma omp simd
    for (int64_t i = 0; i < Dm; ++i) o[i] = xr[i] * r * w[i];
  }
}

// qkv [T, (H + 2 Hkv) * D] -> q_out [T, H, D] rotated; rotated k and v stored in the paged
// caches [P, S, Hkv, D] at flat slots slot[T]. cos/sin: [max_pos, D] tables. q_norm/k_norm
// ([D] or null): each q/k head is RMS-normalised (eps) before its rotation.
void agrt_rope_store(const float* qkv, int64_t T, int32_t H, int32_t Hkv, int32_t D,
                     const int64_t* pos, const float* cos_t, const float* sin_t,
                     const int64_t* slot, const float* q_norm, const float* k_norm, float eps,
                     float* k_cache, float* v_cache, float* q_out) {
  const int64_t ld = (int64_t)(H + 2 * Hkv) * D;
#pragma omp parallel for schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv + t * ld;
    const float* c = cos_t + pos[t] * D;
    const float* s = sin_t + pos[t] * D;
    for (int h = 0; h < H; ++h) norm_rope_row(row + h * D, q_norm, eps, c, s, D, q_out + (t * H + h) * D);
    float* kd = k_cache + slot[t] * Hkv * D;
    float* vd = v_cache + slot[t] * Hkv * D;
    for (int h = 0; h < Hkv; ++h) norm_rope_row(row + (H + h) * D, k_norm, eps, c, s, D, kd + h * D);
    std::memcpy(vd, row + (H + Hkv) * D, sizeof(float) * Hkv * D);
  }
}

// Causal attention over paged KV for the sequences listed in seqs[nseq]: sequence b has
// q_len = cu_q[b+1] - cu_q[b] queries (rows cu_q[b].. of q [T, H, D]) at the last q_len of its
// kv_lens[b] positions, whose pages are page_table[b, :]. Writes the same rows of out [T, H, D].
// One task = up to kRowsPerTask query rows of a sequence x one KV head, with the H/Hkv query
// heads that share it: each key and value row is loaded once for the whole group, and the
// task's later rows find the sequence's K/V in cache (speculation verify steps bring several
// rows per sequence over long contexts).
void agrt_attention(const float* q, const float* k_cache, const float* v_cache,
                    const int64_t* page_table, int64_t max_pages, const int64_t* cu_q,
                    const int64_t* kv_lens, const int64_t* seqs, int64_t nseq, int32_t H,
                    int32_t Hkv, int32_t D, int32_t S, float scale, float* out) {
  int64_t* first = agrt_scratch<int64_t>(kSlotTasks, (size_t)(nseq + 1));
  first[0] = 0;
  for (int64_t i = 0; i < nseq; ++i) {
    const int64_t b = seqs[i];
    first[i + 1] = first[i] + (cu_q[b + 1] - cu_q[b] + kRowsPerTask - 1) / kRowsPerTask * Hkv;
  }
  const int group = H / Hkv;
#pragma omp parallel if (first[nseq] > 1)
  {
#pragma omp for schedule(static)
    for (int64_t task = 0; task < first[nseq]; ++task) {
      const int64_t i = std::upper_bound(first, first + nseq + 1, task) - first - 1;
      const int64_t b = seqs[i], local = task - first[i];
      const int64_t q0 = local / Hkv * kRowsPerTask, hk = local % Hkv;
      const int64_t qlen = cu_q[b + 1] - cu_q[b];
      for (int64_t qi = q0; qi < std::min<int64_t>(q0 + kRowsPerTask, qlen); ++qi) {
        const int64_t row = cu_q[b] + qi, n = kv_lens[b] - qlen + qi + 1;  // keys 0..n-1
        const float* qg = q + (row * H + hk * group) * D;  // the group's query heads, contiguous
        float* og = out + (row * H + hk * group) * D;
        float* sc = agrt_scratch<float>(kSlotScores, (size_t)(n * group));
        const Keys keys{k_cache, v_cache, page_table + b * max_pages, S, (int64_t)Hkv * D, hk * D, n};
#ifdef __AVX512F__
        if (D == 64) {
          attend_avx<4>(qg, group, keys, scale, sc, og);
          continue;
        }
        if (D == 128) {
          attend_avx<8>(qg, group, keys, scale, sc, og);
          continue;
        }
#endif
        attend_generic(qg, group, D, keys, scale, sc, og);
      }
    }
  }
}

// out[T, I] = silu(gu[:, :I]) * gu[:, I:]
void agrt_silu_mul(const float* gu, int64_t T, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (T * I > 65536)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gu + t * 2 * I;
    const float* u = g + I;
    float* o = out + t * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

}  // extern "C"
