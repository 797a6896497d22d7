// The packed quantized weight matrix the GEMM, refine and row kernels read (layout:
// kernels/packing.py): unsigned integers in tiles of 16 output columns, per-group scales (and mins).
#pragma once
#include "common.h"

namespace agrt {

// Scales and mins, param i = (tile * K/G + group) * 16 + column: fp32 (half 0), fp16 (half 1), or
// the K-quants' two levels (half 2, G = 32): per tile and block of 256, 16 fp16 d then 8 x 16 uint8
// sub-scales (160 bytes), the param d * sub-scale -- exact in fp32, so the same numbers as fp32.
constexpr int kTwoLevelBytes = 160;
struct QMat {
  const uint8_t* q; const void* s; const void* m;  // scales/mins: see above
  int32_t z, bits, G, half; int64_t K;
  int64_t tile_bytes() const { return K * 16 * bits / 8; }
  static const uint8_t* block(const void* p, int64_t g) {  // g: the param's group (i >> 4)
    return static_cast<const uint8_t*>(p) + (g >> 3) * kTwoLevelBytes;
  }
  static float at(const void* p, int64_t i, int32_t half) {
    if (half == 2) {
      const uint8_t* b = block(p, i >> 4);
      return agrt_half_to_float(reinterpret_cast<const uint16_t*>(b)[i & 15]) * (float)b[32 + ((i >> 4) & 7) * 16 + (i & 15)];
    }
    return half ? agrt_half_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
  }
  float scale(int64_t i) const { return at(s, i, half); }
  // q[n, k] of column c (n = tile * 16 + c) in its tile `wt` (layout: kernels/packing.py)
  uint8_t q_at(const uint8_t* wt, int c, int64_t k) const {
    const int64_t step = k / 4, lane = k % 4;
    if (bits == 8) return wt[step * 64 + c * 4 + lane];
    const uint8_t b = wt[(step / 2) * 64 + c * 4 + lane];
    return (step % 2) ? (b >> 4) : (b & 15);
  }
  float min(int64_t i) const { return at(m, i, half); }
#ifdef __AVX512F__
  __m512 load16(const void* p, int64_t i) const {  // params i .. i+15
    if (half == 2) {
      const uint8_t* b = block(p, i >> 4);
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)b));
      const __m128i c = _mm_loadu_si128((const __m128i*)(b + 32 + ((i >> 4) & 7) * 16));
      return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c)));
    }
    return half ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(static_cast<const uint16_t*>(p) + i)))
                : _mm512_loadu_ps(static_cast<const float*>(p) + i);
  }
#endif
};

// The AMX kernel (amx.cpp): rows [r_begin, r_end) of the quantized activations x [M, K] (per row
// and group: scale sx, sum of q, sx * sum) x one 16-column weight tile, in blocks of kAmxRows
// rows, the VNNI kernel's numbers (8-bit weights). amx_usable(): the CPU has AMX and the kernel granted this process its tile
// state (AGENTRT_AMX=0: never).
struct AmxRows { const int8_t* q; const float* sx; const int32_t* sum; const float* sxsum; int64_t K; };
constexpr int kAmxRows = 16;
bool amx_usable();
void tiles_amx(const QMat& w, int64_t tile, const AmxRows& x, int64_t r_begin, int64_t r_end, float* y,
               int64_t ldy, int64_t n0, int nvalid, bool accumulate, const float* bias);

}  // namespace agrt
