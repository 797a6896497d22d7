// Quantized matrix multiply for CPU decode and prefill: y[M,N] (+)= x[M,K] @ W^T.
//
// W is stored as unsigned integers q in tiles of 16 output columns (see kernels/packing.py):
//   w[n,k] = s[n,g] * (q[n,k] - z) (+ m[n,g]),  g = k / G
// which reproduces the GGUF formats' dequantization exactly. Activations are quantized per row
// and per group of G to int8 (x ~ sx[g] * xq[k]); one group's dot product is exact in int32:
//   sum_k x w = sx * (s * (dot(xq, q) - z * sum(xq)) + m * sum(xq))
// On AVX-512 VNNI one vpdpbusd multiplies 16 columns x 4 k of u8 weights by 4 broadcast s8
// activations. Rows are computed independently and in a fixed order, so a row's result does not
// depend on how many rows share the call (batch-invariant: batched decode, chunked prefill and
// speculation verify give the same numbers as one sequence alone).
#include <array>
#include <vector>

#include "common.h"
#include "api.h"
#include "qmat.h"

namespace {

using agrt::QMat;

struct XQ {  // quantized activations; per row and group: scale sx, sum of q, and sx * sum
  const int8_t* q; const float* sx; const int32_t* sum; const float* sxsum; int64_t K, ng;
};

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t ldx, int G, int8_t* xq, float* sx,
                   int32_t* sum, float* sxsum) {
  const int64_t ng = K / G;
#pragma omp parallel for schedule(static) if (M * K > 65536)
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      const float* xs = x + r * ldx + g * G;
#ifdef __AVX512F__
      if (G % 16 == 0) {  // the same arithmetic as below, 16 lanes at a time
        __m512 mx = _mm512_setzero_ps();
        for (int k = 0; k < G; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(xs + k)));
        const float d = _mm512_reduce_max_ps(mx) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
        __m512i acc = _mm512_setzero_si512();
        int8_t* o = xq + r * K + g * G;
        for (int k = 0; k < G; k += 16) {  // cvtps rounds to nearest even, as nearbyint does
          const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + k), _mm512_set1_ps(id)));
          _mm_storeu_si128((__m128i*)(o + k), _mm512_cvtepi32_epi8(v));
          acc = _mm512_add_epi32(acc, v);
        }
        const int32_t total = _mm512_reduce_add_epi32(acc);
        sx[r * ng + g] = d;
        sum[r * ng + g] = total;
        if (sxsum) sxsum[r * ng + g] = d * (float)total;
        continue;
      }
#endif
      float amax = 0.f;
      for (int k = 0; k < G; ++k) amax = std::max(amax, std::fabs(xs[k]));
      const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
      int32_t acc = 0;
      int8_t* o = xq + r * K + g * G;
      for (int k = 0; k < G; ++k) {
        const int v = (int)std::nearbyint(xs[k] * id);
        o[k] = (int8_t)v;
        acc += v;
      }
      sx[r * ng + g] = d;
      sum[r * ng + g] = acc;
      if (sxsum) sxsum[r * ng + g] = d * (float)acc;
    }
  }
}

// Portable path: the same integer math, one column at a time.
void tile_generic(const QMat& w, int64_t tile, const XQ& x, int64_t r0, int mr, float* y,
                  int64_t ldy, int64_t n0, int nvalid, bool accumulate, const float* bias) {
  const uint8_t* wt = w.q + tile * w.tile_bytes();
  const int64_t ng = w.K / w.G;
  for (int r = 0; r < mr; ++r) {
    for (int c = 0; c < nvalid; ++c) {
      float acc = 0.f;
      for (int64_t g = 0; g < ng; ++g) {
        int32_t dot = 0;
        for (int j = 0; j < w.G; ++j) {
          const int64_t k = g * w.G + j;
          dot += (int32_t)w.q_at(wt, c, k) * x.q[(r0 + r) * x.K + k];
        }
        const int32_t xs = x.sum[(r0 + r) * ng + g];
        const int64_t si = (tile * ng + g) * 16 + c;
        float v = w.scale(si) * (float)(dot - w.z * xs);
        if (w.m) v += w.min(si) * (float)xs;
        acc += x.sx[(r0 + r) * ng + g] * v;
      }
      float* out = y + (r0 + r) * ldy + n0 + c;
      if (bias) acc += bias[n0 + c];
      *out = accumulate ? *out + acc : acc;
    }
  }
}

constexpr int kRowBlock = 8;  // rows per block of the GEMM

#ifdef __AVX512VNNI__
constexpr int kRB = kRowBlock;
constexpr int kPrefetchTiles = 2;  // prefetch distance (tiles); 1-3 measured alike, 0 ~10% slower at batch 8

// Activations of one block of kRB rows, interleaved so that the kRB rows' values for one k-step
// (4 bytes each) are adjacent: every broadcast is at a constant offset from one pointer.
struct XBlock {
  const int32_t* w;   // [K/4][kRB] four int8 values per word
  const float* sx;    // [ng][kRB]
  const float* sxsum; // [ng][kRB]
  const int32_t* zsum; // [ng][kRB]: -z * sum(xq), the integer dot products' starting value
};

template <int MR, int BITS, int G>
void tile_vnni(const QMat& w, int64_t tile, const XBlock& xb, int64_t r0, float* y, int64_t ldy,
               int64_t n0, int nvalid, bool accumulate, const float* bias) {
  constexpr int group_bytes = G * 16 * BITS / 8;
  const uint8_t* wt = w.q + tile * w.tile_bytes();
  const int64_t ng = w.K / G;
  const int64_t p0 = tile * ng * 16;  // this tile's first scale/min
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  // one accumulator chain per row from 4 rows up; below, two (even and odd k-steps) halve the
  // dependency chain
  constexpr bool kTwo = MR < 4;
  __m512 acc[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m512i dot[MR], dot2[MR];
    const int32_t* zg = xb.zsum + g * kRB;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      dot[r] = w.z ? _mm512_set1_epi32(zg[r]) : _mm512_setzero_si512();
      dot2[r] = _mm512_setzero_si512();
    }
    const uint8_t* wg = wt + g * group_bytes;
    if (kPrefetchTiles > 0) {  // the same group of a later tile: memory reads overlap the math
      const uint8_t* ahead = wg + kPrefetchTiles * w.tile_bytes();
#pragma GCC unroll 8
      for (int b = 0; b < group_bytes; b += 64) __builtin_prefetch(ahead + b, 0, 3);
    }
    const int32_t* xg = xb.w + g * (G / 4) * kRB;
    if constexpr (BITS == 8) {
#pragma GCC unroll 8
      for (int s = 0; s < G / 4; s += 2) {
        const __m512i wv = _mm512_loadu_si512(wg + s * 64);
        const __m512i wv2 = _mm512_loadu_si512(wg + s * 64 + 64);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          dot[r] = _mm512_dpbusd_epi32(dot[r], wv, _mm512_set1_epi32(xg[s * kRB + r]));
          __m512i& d2 = kTwo ? dot2[r] : dot[r];
          d2 = _mm512_dpbusd_epi32(d2, wv2, _mm512_set1_epi32(xg[(s + 1) * kRB + r]));
        }
      }
    } else {
#pragma GCC unroll 8
      for (int s = 0; s < G / 8; ++s) {
        const __m512i raw = _mm512_loadu_si512(wg + s * 64);
        const __m512i wl = _mm512_and_si512(raw, lo4);
        const __m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), lo4);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          dot[r] = _mm512_dpbusd_epi32(dot[r], wl, _mm512_set1_epi32(xg[(2 * s) * kRB + r]));
          __m512i& d2 = kTwo ? dot2[r] : dot[r];
          d2 = _mm512_dpbusd_epi32(d2, wh, _mm512_set1_epi32(xg[(2 * s + 1) * kRB + r]));
        }
      }
    }
    // sum_k x w = sx * s * (dot - z sum(xq)) + m * (sx * sum(xq)): the dots started at -z sum,
    // and the column terms are shared by the rows
    const __m512 sv = w.load16(w.s, p0 + g * 16);
    const float* sxg = xb.sx + g * kRB;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512i d = kTwo ? _mm512_add_epi32(dot[r], dot2[r]) : dot[r];
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sv), _mm512_set1_ps(sxg[r]), acc[r]);
    }
    if (w.m) {
      const __m512 mv = w.load16(w.m, p0 + g * 16);
      const float* ssg = xb.sxsum + g * kRB;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(ssg[r]), acc[r]);
    }
  }
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* out = y + (r0 + r) * ldy + n0;
    __m512 v = _mm512_add_ps(acc[r], bv);
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

template <int BITS, int G>
void tile_rows_vnni(const QMat& w, int64_t tile, const XBlock& x, int64_t r0, int mr, float* y,
                    int64_t ldy, int64_t n0, int nv, bool a, const float* b) {
  switch (mr) {
    case 1: tile_vnni<1, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 2: tile_vnni<2, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 3: tile_vnni<3, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 4: tile_vnni<4, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 5: tile_vnni<5, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 6: tile_vnni<6, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    case 7: tile_vnni<7, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
    default: tile_vnni<8, BITS, G>(w, tile, x, r0, y, ldy, n0, nv, a, b); break;
  }
}

// The (bits, group) pairs with a specialised kernel; others take the portable loops.
bool vnni_shape(const QMat& w) {
  return (w.bits == 4 && w.G == 32) || (w.bits == 8 && (w.G == 32 || w.G == 16));
}

// Interleave rows [r0, r0 + kRB) of the quantized activations into block layout (zero padded).
void interleave(const XQ& x, int64_t M, int64_t r0, int32_t z, int32_t* w, float* sx, float* sxsum,
                int32_t* zsum) {
  const int64_t steps = x.K / 4;
  for (int r = 0; r < kRB; ++r) {
    const bool live = r0 + r < M;
    const int32_t* src = live ? (const int32_t*)(x.q + (r0 + r) * x.K) : nullptr;
    for (int64_t s = 0; s < steps; ++s) w[s * kRB + r] = live ? src[s] : 0;
    for (int64_t g = 0; g < x.ng; ++g) {
      sx[g * kRB + r] = live ? x.sx[(r0 + r) * x.ng + g] : 0.f;
      sxsum[g * kRB + r] = live ? x.sxsum[(r0 + r) * x.ng + g] : 0.f;
      zsum[g * kRB + r] = live ? -z * x.sum[(r0 + r) * x.ng + g] : 0;
    }
  }
}
#endif

constexpr int64_t kTileMajorBlocks = 8;  // up to 64 rows: every row block per weight tile

// The quantized activations of one call, and their interleaved row blocks when the VNNI kernel
// takes this weight shape (blocks == nullptr: the portable loops).
struct XRows {
  XQ xs; int64_t M; const int32_t* blocks; const float* bsx; const float* bss; const int32_t* bzs;
  bool amx = false;  // the AMX kernel runs (else the VNNI kernel or the portable loops)
};

// Where the AMX kernel runs (if usable): 8-bit weights, 32 to 128 rows, where it measured 11-13%
// faster than VNNI on a Xeon with AMX. Elsewhere VNNI was as fast or faster: the per-group float
// steps (the same in both kernels) dominate below 32 rows, 4-bit tiles pay their unpacking, and
// from 256 rows the weight tiles streamed per row chunk cost more than the tiles save.
constexpr int64_t kAmxMinRows = 32, kAmxMaxRows = 128;
constexpr int64_t kAmxChunk = 256;  // rows per AMX task

// Rows [rb * kRowBlock, +kRowBlock) x the 16 columns of `tile`.
void run_tile(const QMat& w, const XRows& x, int64_t N, int64_t tile, int64_t rb, float* y,
              int64_t ldy, bool accumulate, const float* bias) {
  const int64_t r0 = rb * kRowBlock, ng = x.xs.ng;
  const int mr = (int)std::min<int64_t>(kRowBlock, x.M - r0);
  const int64_t n0 = tile * 16;
  const int nv = (int)std::min<int64_t>(16, N - n0);
#ifdef __AVX512VNNI__
  if (x.blocks != nullptr) {
    const XBlock xb{x.blocks + rb * (w.K / 4) * kRB, x.bsx + rb * ng * kRB, x.bss + rb * ng * kRB,
                    x.bzs + rb * ng * kRB};
    if (w.bits == 4)
      tile_rows_vnni<4, 32>(w, tile, xb, r0, mr, y, ldy, n0, nv, accumulate, bias);
    else if (w.G == 32)
      tile_rows_vnni<8, 32>(w, tile, xb, r0, mr, y, ldy, n0, nv, accumulate, bias);
    else
      tile_rows_vnni<8, 16>(w, tile, xb, r0, mr, y, ldy, n0, nv, accumulate, bias);
    return;
  }
#endif
  tile_generic(w, tile, x.xs, r0, mr, y, ldy, n0, nv, accumulate, bias);
}

// The bytes of prepare_rows' buffers, in the order it takes them: xq, sx, sum, sxsum, then (for
// the VNNI kernel's row blocks) block w, sx, sxsum, zsum.
constexpr int kRowBuffers = 8;
std::array<size_t, kRowBuffers> row_bytes(int64_t M, int64_t K, const QMat& w) {
  const size_t ng = (size_t)(K / w.G), rblocks = (size_t)((M + kRowBlock - 1) / kRowBlock);
  const size_t per_group = (size_t)M * ng * 4, per_block = rblocks * ng * kRowBlock * 4;
  return {(size_t)(M * K), per_group, per_group, per_group, rblocks * (size_t)(K / 4) * kRowBlock * 4,
          per_block, per_block, per_block};
}

// The quantized (and, for the VNNI kernel, interleaved) activations of x[M, K] for `w`, in
// buffers from `take(slot, bytes)` (sizes: row_bytes).
template <class Take>
XRows prepare_rows(const float* x, int64_t M, int64_t K, int64_t ldx, const QMat& w, Take take) {
  const int64_t ng = K / w.G;
  const auto b = row_bytes(M, K, w);
  int8_t* xq = static_cast<int8_t*>(take(kSlotXq, b[0]));
  float* sx = static_cast<float*>(take(kSlotSx, b[1]));
  int32_t* sum = static_cast<int32_t*>(take(kSlotSum, b[2]));
  float* sxsum = static_cast<float*>(take(kSlotSxSum, b[3]));
  quantize_rows(x, M, K, ldx, w.G, xq, sx, sum, sxsum);
  XRows xr{XQ{xq, sx, sum, sxsum, K, ng}, M, nullptr, nullptr, nullptr, nullptr};
#ifdef __AVX512VNNI__
  if (vnni_shape(w) && w.bits == 8 && M >= kAmxMinRows && M <= kAmxMaxRows && agrt::amx_usable()) {
    xr.amx = true;
  } else if (vnni_shape(w)) {
    const int64_t rblocks = (M + kRowBlock - 1) / kRowBlock;
    int32_t* bw = static_cast<int32_t*>(take(kSlotBlockW, b[4]));
    float* bsx = static_cast<float*>(take(kSlotBlockSx, b[5]));
    float* bss = static_cast<float*>(take(kSlotBlockSs, b[6]));
    int32_t* bzs = static_cast<int32_t*>(take(kSlotBlockZs, b[7]));
    for (int64_t rb = 0; rb < rblocks; ++rb)
      interleave(xr.xs, M, rb * kRB, w.z, bw + rb * (K / 4) * kRB, bsx + rb * ng * kRB,
                 bss + rb * ng * kRB, bzs + rb * ng * kRB);
    xr.blocks = bw, xr.bsx = bsx, xr.bss = bss, xr.bzs = bzs;
  }
#endif
  return xr;
}

// Small M (decode, verify): one task = one 16-column tile x every row block, so each weight
// byte is read from memory once and reused from L1 by all rows (the output head at batch 8 is
// 16 rows: tile-fastest order streamed its 28 MB twice). Large M (prefill): one task = one tile
// x one row block, tiles fastest, so that threads share the rows and split the weights.
struct Tasks {
  int64_t tiles, rblocks; bool tile_major;
  Tasks(int64_t M, int64_t N, bool amx) : tiles((N + 15) / 16), rblocks((M + kRowBlock - 1) / kRowBlock),
                                          tile_major(rblocks <= kTileMajorBlocks), amx_chunks((M + kAmxChunk - 1) / kAmxChunk),
                                          amx(amx) {}
  int64_t amx_chunks; bool amx;
  int64_t count() const { return amx ? tiles * amx_chunks : tile_major ? tiles : tiles * rblocks; }
  void run(int64_t task, const QMat& w, const XRows& x, int64_t N, float* y, int64_t ldy, bool acc,
           const float* bias) const {
    const int64_t tile = task % tiles;
    if (x.amx) {  // one tile x up to kAmxChunk rows
      const agrt::AmxRows xa{x.xs.q, x.xs.sx, x.xs.sum, x.xs.sxsum, x.xs.K};
      const int64_t r0 = task / tiles * kAmxChunk;
      return agrt::tiles_amx(w, tile, xa, r0, std::min(x.M, r0 + kAmxChunk), y, ldy, tile * 16,
                             (int)std::min<int64_t>(16, N - tile * 16), acc, bias);
    }
    const int64_t rb0 = tile_major ? 0 : task / tiles, rb1 = tile_major ? rblocks : rb0 + 1;
    for (int64_t rb = rb0; rb < rb1; ++rb) run_tile(w, x, N, tile, rb, y, ldy, acc, bias);
  }
};

// y[M, ldy] at columns [0, N): (+)= x[M, K] (row stride ldx) @ W^T (+ bias).
// W: q (tiles of 16 columns, ceil(N/16) tiles), s and m [tiles, K/G, 16] (m may be null).
static void qgemm_rows(const float* x, int64_t M, int64_t K, int64_t ldx, const QMat& w, int64_t N,
                       float* y, int64_t ldy, bool accumulate, const float* bias) {
  const XRows xr = prepare_rows(x, M, K, ldx, w, [](int slot, size_t b) { return agrt_scratch_bytes(slot, b); });
  const Tasks t(M, N, xr.amx);
  const int64_t ntasks = t.count();
#pragma omp parallel for schedule(static) if (ntasks > 1)
  for (int64_t task = 0; task < ntasks; ++task) t.run(task, w, xr, N, y, ldy, accumulate, bias);
}

}  // namespace

extern "C" {

int agrt_has_amx(void) { return agrt::amx_usable() ? 1 : 0; }

int agrt_has_vnni(void) {
#ifdef __AVX512VNNI__
  return 1;
#else
  return 0;
#endif
}

// precise != 0: x is split into its int8 rounding and the rounding's residual, both quantized
// (two int8 terms, ~127x smaller activation error) at twice the integer work; for layers whose
// outputs decide the argmax (the output head).
void agrt_qgemm(const float* x, int64_t M, int64_t K, int64_t ldx, const uint8_t* q,
                const void* s, const void* m, int32_t half, int32_t z, int32_t bits, int32_t G,
                int64_t N, float* y, int64_t ldy, int32_t accumulate, const float* bias,
                int32_t precise) {
  if (M <= 0 || N <= 0) return;
  const QMat w{q, s, m, z, bits, G, half, K};
  if (!precise) {
    qgemm_rows(x, M, K, ldx, w, N, y, ldy, accumulate != 0, bias);
    return;
  }
  const int64_t ng = K / G;
  float* x2 = agrt_scratch<float>(kSlotPreciseX, (size_t)(2 * M * K));  // x; x - its rounding
  int8_t* xq = agrt_scratch<int8_t>(kSlotPreciseQ, (size_t)(M * K));
  float* sx = agrt_scratch<float>(kSlotPreciseSx, (size_t)(M * ng));
  int32_t* sum = agrt_scratch<int32_t>(kSlotPreciseSum, (size_t)(M * ng));
  quantize_rows(x, M, K, ldx, G, xq, sx, sum, nullptr);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const float v = x[r * ldx + k];
      x2[r * K + k] = v;
      x2[(M + r) * K + k] = v - sx[r * ng + k / G] * (float)xq[r * K + k];
    }
  float* y2 = agrt_scratch<float>(kSlotPreciseY, (size_t)(2 * M * N));
  qgemm_rows(x2, 2 * M, K, K, w, N, y2, N, false, nullptr);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t n = 0; n < N; ++n) {
      float v = y2[r * N + n] + y2[(M + r) * N + n];
      if (bias) v += bias[n];
      float* o = y + r * ldy + n;
      *o = accumulate ? *o + v : v;
    }
}

}  // extern "C"

// Several independent GEMMs (each y = x @ W^T, no accumulate, no bias) in one parallel loop over
// all their tiles: a mixture-of-experts layer's experts at decode, where each expert's GEMM is
// too short to pay for a parallel region of its own. Each job's numbers are qgemm_rows' own.
void agrt::qgemm_group(const GemmJob* jobs, int n) {
  std::vector<QMat> ws;
  std::vector<XRows> xr((size_t)n);
  std::vector<Tasks> ts;
  std::vector<int64_t> first((size_t)n + 1, 0);
  auto pad = [](size_t b) { return (b + 63) / 64 * 64; };
  size_t bytes = 0;  // every job's activations in one scratch buffer, 64-byte aligned pieces
  for (int j = 0; j < n; ++j) {
    const AgrtPart& p = *jobs[j].p;
    ws.push_back(QMat{p.q, p.s, p.m, p.z, p.bits, p.group, p.half, p.k});
    for (size_t b : row_bytes(jobs[j].M, p.k, ws.back())) bytes += pad(b);
  }
  uint8_t* buf = static_cast<uint8_t*>(agrt_scratch_bytes(kSlotGroup, bytes));
  size_t at = 0;
  auto take = [&](int, size_t b) { void* q = buf + at; at += pad(b); return q; };
  for (int j = 0; j < n; ++j) {
    xr[j] = prepare_rows(jobs[j].x, jobs[j].M, jobs[j].p->k, jobs[j].ldx, ws[j], take);
    ts.emplace_back(jobs[j].M, jobs[j].p->n, xr[j].amx);
    first[j + 1] = first[j] + ts.back().count();
  }
  const int64_t ntasks = first[n];
#pragma omp parallel for schedule(static) if (ntasks > 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    int j = 0;
    while (first[j + 1] <= task) ++j;
    ts[j].run(task - first[j], ws[j], xr[j], jobs[j].p->n, jobs[j].y, jobs[j].ldy, false, nullptr);
  }
}
