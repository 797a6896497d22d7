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

struct RopeArgs {
  const float* qkv; int64_t T; int32_t H, Hkv, D; const int64_t* pos; const float* cos_t;
  const float* sin_t; const int64_t* slot; const float* q_norm; const float* k_norm; float eps;
  float* q_out;
};

inline void store_row(const float* src, int n, float* dst) { std::memcpy(dst, src, sizeof(float) * n); }
inline void store_row(const float* src, int n, uint16_t* dst) {
  int i = 0;
#ifdef __AVX512F__
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(dst + i), _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) dst[i] = agrt_float_to_half(src[i]);
}

template <typename T>
void rope_store(const RopeArgs& a, T* k_cache, T* v_cache) {
  const int64_t ld = (int64_t)(a.H + 2 * a.Hkv) * a.D;
  const int D = a.D;
#pragma omp parallel for schedule(static) if (a.T > 16)
  for (int64_t t = 0; t < a.T; ++t) {
    const float* row = a.qkv + t * ld;
    const float* c = a.cos_t + a.pos[t] * D;
    const float* s = a.sin_t + a.pos[t] * D;
    for (int h = 0; h < a.H; ++h) norm_rope_row(row + h * D, a.q_norm, a.eps, c, s, D, a.q_out + (t * a.H + h) * D);
    T* kd = k_cache + a.slot[t] * a.Hkv * D;
    T* vd = v_cache + a.slot[t] * a.Hkv * D;
    float* kr = agrt_scratch<float>(kSlotKvRow, (size_t)D);
    for (int h = 0; h < a.Hkv; ++h) {
      norm_rope_row(row + (a.H + h) * D, a.k_norm, a.eps, c, s, D, kr);
      store_row(kr, D, kd + h * D);
    }
    store_row(row + (a.H + a.Hkv) * D, a.Hkv * D, vd);
  }
}

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
// caches [P, S, Hkv, D] at flat slots slot[T] (float, or IEEE half when kv_half). cos/sin:
// [max_pos, D] tables. q_norm/k_norm ([D] or null): each q/k head is RMS-normalised (eps) before
// its rotation.
void agrt_rope_store(const float* qkv, int64_t T, int32_t H, int32_t Hkv, int32_t D,
                     const int64_t* pos, const float* cos_t, const float* sin_t,
                     const int64_t* slot, const float* q_norm, const float* k_norm, float eps,
                     void* k_cache, void* v_cache, float* q_out, int32_t kv_half) {
  const RopeArgs a{qkv, T, H, Hkv, D, pos, cos_t, sin_t, slot, q_norm, k_norm, eps, q_out};
  if (kv_half)
    rope_store(a, static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
  else
    rope_store(a, static_cast<float*>(k_cache), static_cast<float*>(v_cache));
}

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

// out[r] = the index of the first largest value of row r of x [M, N] (row stride ldx); a row
// holding NaN gives its first NaN, as torch.argmax does.
void agrt_argmax(const float* x, int64_t M, int64_t N, int64_t ldx, int64_t* out) {
#pragma omp parallel for schedule(static) if (M > 1)
  for (int64_t r = 0; r < M; ++r) {
    const float* row = x + r * ldx;
    float mx = -INFINITY;
    bool nan = false;
    int64_t i = 0;
#ifdef __AVX512F__
    __m512 mv = _mm512_set1_ps(-INFINITY);
    __mmask16 bad = 0;
    for (; i + 16 <= N; i += 16) {
      const __m512 v = _mm512_loadu_ps(row + i);
      bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      mv = _mm512_max_ps(mv, v);
    }
    mx = _mm512_reduce_max_ps(mv);
    nan = bad != 0;
#endif
    for (; i < N; ++i) {
      nan = nan || row[i] != row[i];
      mx = std::max(mx, row[i]);
    }
    int64_t j = 0;
#ifdef __AVX512F__
    const __m512 target = _mm512_set1_ps(mx);
    for (; j + 16 <= N; j += 16) {
      const __m512 v = _mm512_loadu_ps(row + j);
      const __mmask16 hit = nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) : _mm512_cmp_ps_mask(v, target, _CMP_EQ_OQ);
      if (hit) break;
    }
#endif
    while (j < N && !(nan ? row[j] != row[j] : row[j] == mx)) ++j;
    out[r] = j < N ? j : 0;
  }
}

// out[T, I] = silu(gu[:, :I]) * gu[:, I:]
void agrt_silu_mul(const float* gu, int64_t T, int64_t I, float* out) {
#pragma omp parallel for schedule(static) if (T * I > 1 << 20)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gu + t * 2 * I;
    const float* u = g + I;
    float* o = out + t * I;
    int64_t i = 0;
#ifdef __AVX512F__
    // silu(g) = g * sigmoid(g), sigmoid from e = exp(-|g|): 1 / (1 + e), or e / (1 + e) for g < 0
    const __m512 one = _mm512_set1_ps(1.f);
    for (; i + 16 <= I; i += 16) {
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(gv)));
      const __mmask16 neg = _mm512_cmp_ps_mask(gv, _mm512_setzero_ps(), _CMP_LT_OQ);
      const __m512 num = _mm512_mask_blend_ps(neg, one, e);
      const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < I; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
  }
}

}  // extern "C"
