// Fused elementwise kernels of one decoder layer (fp32), one call each (attention: attention.cpp).
// They replace chains of small torch ops whose per-op dispatch cost dominated a decode step.
#include <type_traits>

#include "common.h"
#include "api.h"

namespace {

// out[0..D) <- one head of x, RMS-normalised with weight w first when w is set (Qwen3's q/k
// norm: same formula as agrt_rmsnorm), then rotated in place (rotate-half layout).
inline void norm_rope_row(const float* x, const float* w, float eps, const float* c, const float* s,
                          int D, float* out) {
  if (w != nullptr) {
    const float r = 1.f / std::sqrt(agrt_sumsq(x, D) / (float)D + eps);
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

// int8: one head's D values as int8, each group of kKvGroup with its scale amax / 127 (floats
// after the values: D + 4 * kv_groups(D) bytes), rounded to nearest even as the activations'
// int8 (kernels/reference.quantize_kv)
inline void store_row_int8(const float* src, int D, int8_t* dst) {
  for (int g = 0; g < kv_groups(D); ++g) {
    const int a = g * kKvGroup, b = std::min(D, a + kKvGroup);
    float amax = 0.f;
    for (int i = a; i < b; ++i) amax = std::max(amax, std::fabs(src[i]));
    const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
    for (int i = a; i < b; ++i) dst[i] = (int8_t)std::max(-127.f, std::min(127.f, std::nearbyint(src[i] * id)));
    std::memcpy(dst + D + 4 * g, &d, sizeof d);
  }
}
inline void store_head(const float* src, int D, float* dst) { store_row(src, D, dst); }
inline void store_head(const float* src, int D, uint16_t* dst) { store_row(src, D, dst); }
inline void store_head(const float* src, int D, int8_t* dst) { store_row_int8(src, D, dst); }

template <typename T>
void rope_store(const RopeArgs& a, T* k_cache, T* v_cache) {
  const int extra = std::is_same<T, int8_t>::value ? 4 * kv_groups(a.D) : 0;  // (the int8 rows' scales)
  const int64_t ld = (int64_t)(a.H + 2 * a.Hkv) * a.D;
  const int D = a.D;
#pragma omp parallel for schedule(static) if (a.T > 16)
  for (int64_t t = 0; t < a.T; ++t) {
    const float* row = a.qkv + t * ld;
    const float* c = a.cos_t + a.pos[t] * D;
    const float* s = a.sin_t + a.pos[t] * D;
    for (int h = 0; h < a.H; ++h) norm_rope_row(row + h * D, a.q_norm, a.eps, c, s, D, a.q_out + (t * a.H + h) * D);
    T* kd = k_cache + a.slot[t] * a.Hkv * (D + extra);
    T* vd = v_cache + a.slot[t] * a.Hkv * (D + extra);
    float* kr = agrt_scratch<float>(kSlotKvRow, (size_t)D);
    for (int h = 0; h < a.Hkv; ++h) {
      norm_rope_row(row + (a.H + h) * D, a.k_norm, a.eps, c, s, D, kr);
      store_head(kr, D, kd + h * (D + extra));
      store_head(row + (a.H + a.Hkv + h) * D, D, vd + h * (D + extra));
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
    const float r = 1.f / std::sqrt(agrt_sumsq(xr, Dm) / (float)Dm + eps);  // (a fixed order: common.h)
    float* o = out + t * Dm;
#pragma omp simd
    for (int64_t i = 0; i < Dm; ++i) o[i] = xr[i] * r * w[i];
  }
}

// qkv [T, (H + 2 Hkv) * D] -> q_out [T, H, D] rotated; rotated k and v stored in the paged
// caches [P, S, Hkv, D] at flat slots slot[T] (kv_mode 0 float, 1 IEEE half, 2 int8 rows of D
// values and a float scale per 32: [P, S, Hkv, D + 4 * ceil(D / 32)] bytes). cos/sin:
// [max_pos, D] tables. q_norm/k_norm ([D] or null): each q/k head is RMS-normalised (eps) before
// its rotation.
void agrt_rope_store(const float* qkv, int64_t T, int32_t H, int32_t Hkv, int32_t D,
                     const int64_t* pos, const float* cos_t, const float* sin_t,
                     const int64_t* slot, const float* q_norm, const float* k_norm, float eps,
                     void* k_cache, void* v_cache, float* q_out, int32_t kv_mode) {
  const RopeArgs a{qkv, T, H, Hkv, D, pos, cos_t, sin_t, slot, q_norm, k_norm, eps, q_out};
  if (kv_mode == 2)
    rope_store(a, static_cast<int8_t*>(k_cache), static_cast<int8_t*>(v_cache));
  else if (kv_mode == 1)
    rope_store(a, static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
  else
    rope_store(a, static_cast<float*>(k_cache), static_cast<float*>(v_cache));
}

// x[i] = -inf where bit i % 32 of words[i / 32] is 0, for i < n (a grammar's token bitmask over
// one logits row; an all-ones word is skipped).
void agrt_apply_bitmask(float* x, const int32_t* words, int64_t n) {
  for (int64_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = (uint32_t)words[w];
    if (bits == 0xFFFFFFFFu) continue;
    const int64_t base = w * 32, m = std::min<int64_t>(32, n - base);
#ifdef __AVX512F__
    if (m == 32) {
      const __m512 ninf = _mm512_set1_ps(-INFINITY);
      _mm512_mask_storeu_ps(x + base, (__mmask16)~(bits & 0xFFFFu), ninf);
      _mm512_mask_storeu_ps(x + base + 16, (__mmask16)~(bits >> 16), ninf);
      continue;
    }
#endif
    for (int64_t i = 0; i < m; ++i)
      if (!((bits >> i) & 1u)) x[base + i] = -INFINITY;
  }
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

// out[t, :] = gelu_tanh(gu[t, :I]) * gu[t, I:] (GeGLU, Gemma): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))),
// torch's gelu(approximate="tanh")
void agrt_gelu_mul(const float* gu, int64_t T, int64_t I, float* out) {
  const float beta = 0.7978845608028654f, kappa = 0.044715f;
#pragma omp parallel for schedule(static) if (T * I > 1 << 18)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gu + t * 2 * I;
    const float* u = g + I;
    float* o = out + t * I;
    for (int64_t i = 0; i < I; ++i) {
      const float x = g[i], inner = beta * (x + kappa * x * x * x);
      o[i] = 0.5f * x * (1.f + std::tanh(inner)) * u[i];
    }
  }
}

}  // extern "C"
