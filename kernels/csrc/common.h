// Shared includes of the agentrt CPU kernels (a plain C ABI library, loaded with ctypes).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include <cstdlib>

// IEEE half -> float (F16C when the CPU has it).
inline float agrt_half_to_float(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int e = -1;
    uint32_t m = man;
    do { m <<= 1; ++e; } while (!(m & 0x400));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// float -> IEEE half, rounded to nearest even (F16C when the CPU has it; the same bits as
// torch's .to(torch.float16)).
inline uint16_t agrt_float_to_half(float f) {
#ifdef __F16C__
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return (uint16_t)(sign | 0x7C00 | (x > 0x7F800000u ? 0x200 : 0));  // inf/nan
  if (x >= 0x477FF000u) return (uint16_t)(sign | 0x7C00);  // rounds past the largest half
  if (x < 0x38800000u) {  // a subnormal half (or zero): round the shifted mantissa
    if (x < 0x33000000u) return (uint16_t)sign;
    const uint32_t e = x >> 23, m = (x & 0x7FFFFF) | 0x800000, shift = 126 - e;
    uint32_t h = m >> (shift - 10 + 1);
    const uint32_t rest = m & ((1u << (shift - 10 + 1)) - 1), halfway = 1u << (shift - 10);
    if (rest > halfway || (rest == halfway && (h & 1))) ++h;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((x - 0x38000000u) >> 13);
  const uint32_t rest = x & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return (uint16_t)(sign | h);
#endif
}

// sum of x[i]^2 for i < n in an order fixed by n alone: 64 running sums (sum j takes the i = j
// mod 64 below the last whole 64, in order), folded pairwise (j + 32, then + 16, ..., + 1), then
// the rest in order; products and sums rounded separately (no FMA). Written out, not left to an
// `omp simd reduction`, whose order is the compiler's vector width: GCC's -march=native tuning
// gave 8 lanes on a Xeon and 16 on an AMD Zen, so every rmsnorm differed in its last bits and
// greedy tokens diverged between the two (docs/determinism.md). The AVX-512 loop (four
// registers: four independent chains) and the portable loop give the same bits.
#ifdef __AVX512F__
// 64 running sums in four registers (sum j: register j / 16, lane j % 16) folded pairwise:
// + 32 (registers 2, 3 onto 0, 1), + 16, + 8, + 4, + 2, + 1 (the portable loops' order)
inline float agrt_fold64(const __m512 acc[4]) {
  const __m512 a = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}
#endif

// One weight: float, or bf16 (the top half of a float: widened exactly).
inline float agrt_load_w(const float* p, int64_t i) { return p[i]; }
inline float agrt_load_w(const uint16_t* p, int64_t i) {
  const uint32_t bits = (uint32_t)p[i] << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
#ifdef __AVX512F__
inline __m512 agrt_load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 agrt_load16(const uint16_t* p) {  // 16 bf16 values, widened exactly
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif

// a . x over n values in that order (a: float or bf16); agrt_sumsq is agrt_dot(x, x, n).
template <typename W>
inline float agrt_dot(const W* a, const float* x, int64_t n) {
  constexpr int kLanes = 64;
  int64_t i = 0;
  float s;
#ifdef __AVX512F__
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (; i + kLanes <= n; i += kLanes)
    for (int r = 0; r < 4; ++r)
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(agrt_load16(a + i + 16 * r), _mm512_loadu_ps(x + i + 16 * r)));
  s = agrt_fold64(acc);
#else
  float lane[kLanes] = {};
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] += agrt_load_w(a, i + j) * x[i + j];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  s = lane[0];
#endif
  for (; i < n; ++i) s += agrt_load_w(a, i) * x[i];
  return s;
}

inline float agrt_sumsq(const float* x, int64_t n) { return agrt_dot(x, x, n); }

// An int8 KV store's rows: a head's D values as int8, then one float scale (amax / 127) per
// group of kKvGroup values (kernels/reference.quantize_kv).
constexpr int kKvGroup = 32;
inline int kv_groups(int D) { return (D + kKvGroup - 1) / kKvGroup; }

// One KV cache element: float, or IEEE half stored as uint16_t.
inline float agrt_kv_load(const float* p) { return *p; }
inline float agrt_kv_load(const uint16_t* p) { return agrt_half_to_float(*p); }
inline void agrt_kv_store(float* p, float v) { *p = v; }
inline void agrt_kv_store(uint16_t* p, float v) { *p = agrt_float_to_half(v); }

// Grow-only scratch memory of the calling thread, kept across calls: no allocation, page fault
// or zero fill per call (a decode step makes ~300 kernel calls). The contents are undefined;
// each slot is used by one function at a time, so nested calls use different slots. Internal
// linkage: two builds of the library loaded in one process never share (or overrun) buffers.
namespace {
enum AgrtSlot {
  kSlotXq, kSlotSx, kSlotSum, kSlotSxSum, kSlotBlockW, kSlotBlockSx, kSlotBlockSs, kSlotBlockZs,
  kSlotPreciseX, kSlotPreciseQ, kSlotPreciseSx, kSlotPreciseSum, kSlotPreciseY,
  kSlotH, kSlotQkv, kSlotQ, kSlotAtt, kSlotGu, kSlotAct, kSlotScores, kSlotTasks, kSlotKvRow,
  kSlotMoeRoute, kSlotMoeRows, kSlotMoeX, kSlotMoeGu, kSlotMoeAct, kSlotMoeY, kSlotPost, kSlotGroup, kSlotPartials, kSlotPartSeg, kSlotPartState, kSlotLoraT, kSlotLoraAcc, kSlotCount
};

inline void* agrt_scratch_bytes(int slot, size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t cap = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[kSlotCount];
  Buf& b = bufs[slot];
  if (b.cap < bytes) {
    std::free(b.p);
    b.cap = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, b.cap);
  }
  return b.p;
}

template <typename T>
inline T* agrt_scratch(int slot, size_t n) {
  return static_cast<T*>(agrt_scratch_bytes(slot, n * sizeof(T)));
}

}  // namespace

#ifdef __AVX512F__
// e^x for x <= 0 (softmax after subtracting the max; silu): 2^n * 2^f, degree-7 Taylor for 2^f,
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
