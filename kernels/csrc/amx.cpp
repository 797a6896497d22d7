// Intel AMX tiles for the quantized GEMM's integer dot products (qgemm.cpp picks it where it
// measured faster: 8-bit weights, 32 to 128 rows): one TDPBSUD multiplies up to 16
// activation rows by a 16-column weight tile over one quantization group, where AVX-512 VNNI
// issues one vpdpbusd per row and 4 k. The 8-bit weight tiles need no repacking:
// kernels/packing.py's layout (per k-step of 4, 16 columns x 4 bytes) is the tile's B layout.
// (4-bit tiles, unpacked to bytes first, measured no faster than VNNI: not taken.)
//
// Same numbers as the VNNI kernel (qgemm.cpp, tile_vnni): each group's dot product is the same
// exact int32, and the float steps that follow are the same operations in the same order, so a
// row's result is bitwise the same through either kernel and batch invariance holds whichever
// runs (tests/test_kernels.py checks it).
//
// The kernel grants a process AMX state on request (arch_prctl ARCH_REQ_XCOMP_PERM); without it
// (an older kernel, a sandbox), or on a CPU without AMX, the VNNI kernel runs.
#include "common.h"
#include "api.h"
#include "qmat.h"

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__AVX512VNNI__)
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0-3: C (mr rows of 16 int32; two sets of two groups), tmm4-5: A (mr rows of G int8),
// tmm6-7: B (G/4 rows of 64 bytes)
void configure(int mr, int G) {
  TileConfig c;  // (unused tiles: 0 rows and bytes, as a stored configuration reads)
  for (int t = 0; t < 4; ++t) c.rows[t] = (uint8_t)mr, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = (uint8_t)mr, c.colsb[t] = (uint16_t)G;
  for (int t = 6; t < 8; ++t) c.rows[t] = (uint8_t)(G / 4), c.colsb[t] = 64;
  TileConfig now;
  _tile_storeconfig(&now);  // (loading a configuration costs ~100s of cycles: only on a change)
  if (std::memcmp(&now, &c, sizeof c) != 0) _tile_loadconfig(&c);
}

// One call's view: rows [r0, r0 + mr) of x against one weight tile, whose B rows (unsigned
// bytes, G/4 rows of 64 per group) are `b`.
struct Job {
  const agrt::AmxRows& x; const int8_t* xr; const uint8_t* b; int64_t ng; int G;
  const uint8_t* weights(int64_t g) const { return b + g * (G / 4) * 64; }
};

// Groups g and g + 1 (when < ng) into C tiles C0 and C1, stored to c[0], c[1]. The stores wait
// for their products; the caller meanwhile finishes the other set's groups. (The tile
// intrinsics take literal tile numbers: a macro per set.)
#define AGRT_AMX_ISSUE(NAME, C0, C1)                                           \
  void NAME(const Job& j, int64_t g, int32_t(*c)[16][16]) {                    \
    _tile_zero(C0);                                                            \
    _tile_loadd(4, j.xr + g * j.G, j.x.K);                                     \
    _tile_loadd(6, j.weights(g), 64);                                          \
    _tile_dpbsud(C0, 4, 6);                                                    \
    if (g + 1 < j.ng) {                                                        \
      _tile_zero(C1);                                                          \
      _tile_loadd(5, j.xr + (g + 1) * j.G, j.x.K);                             \
      _tile_loadd(7, j.weights(g + 1), 64);                                    \
      _tile_dpbsud(C1, 5, 7);                                                  \
    }                                                                          \
    _tile_stored(C0, c[0], 64);                                                \
    if (g + 1 < j.ng) _tile_stored(C1, c[1], 64);                              \
  }
AGRT_AMX_ISSUE(issue0, 0, 1)
AGRT_AMX_ISSUE(issue1, 2, 3)
#undef AGRT_AMX_ISSUE

}  // namespace

bool agrt::amx_usable() {  // (AGENTRT_AMX=0: the VNNI kernel only, read once per process)
  static const bool ok = [] {
    const char* env = std::getenv("AGENTRT_AMX");
    if (env != nullptr && env[0] == '0') return false;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

namespace {

template <int MR>
void tile_rows(const agrt::QMat& w, int64_t tile, const uint8_t* b, const agrt::AmxRows& x, int64_t r0, float* y,
               int64_t ldy, int64_t n0, int nvalid, bool accumulate, const float* bias) {
  constexpr int mr = MR;
  const int G = w.G;
  const Job j{x, x.q + r0 * x.K, b, w.K / G, G};
  const int64_t p0 = tile * j.ng * 16;
  alignas(64) int32_t c[2][2][16][16];  // [set][group of the pair][row][column]
  configure(mr, G);  // (per call: another library may have loaded its own tile shapes)
  __m512 acc[MR];
#pragma GCC unroll 16
  for (int r = 0; r < mr; ++r) acc[r] = _mm512_setzero_ps();
  // tile_vnni's float steps per group, in group order: dot - z sum(xq), * s, * sx (+ m sx sum)
  auto finish = [&](int64_t g, const int32_t (*cg)[16]) {
    const __m512 sv = w.load16(w.s, p0 + g * 16);
    const __m512 mv = w.m ? w.load16(w.m, p0 + g * 16) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < mr; ++r) {
      const int64_t i = (r0 + r) * j.ng + g;
      const __m512i d = _mm512_add_epi32(_mm512_load_si512(cg[r]), _mm512_set1_epi32(-w.z * x.sum[i]));
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(d), sv), _mm512_set1_ps(x.sx[i]), acc[r]);
      if (w.m) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.sxsum[i]), acc[r]);
    }
  };
  // pairs of groups, two sets in flight: the tiles multiply pair p + 1 while pair p is finished
  issue0(j, 0, c[0]);
  for (int64_t g = 0; g < j.ng; g += 2) {
    const int set = (int)((g / 2) & 1);
    if (g + 2 < j.ng) {
      if (set == 0)
        issue1(j, g + 2, c[1]);
      else
        issue0(j, g + 2, c[0]);
    }
    finish(g, c[set][0]);
    if (g + 1 < j.ng) finish(g + 1, c[set][1]);
  }
  const __mmask16 mask = (__mmask16)((1u << nvalid) - 1u);
  const __m512 bv = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < mr; ++r) {
    float* out = y + (r0 + r) * ldy + n0;
    __m512 v = _mm512_add_ps(acc[r], bv);
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

}  // namespace

void agrt::tiles_amx(const QMat& w, int64_t tile, const AmxRows& x, int64_t r_begin, int64_t r_end, float* y,
                     int64_t ldy, int64_t n0, int nvalid, bool accumulate, const float* bias) {
  const uint8_t* b = w.q + tile * w.tile_bytes();  // (8-bit weights: the tile's own bytes)
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kAmxRows) {
    switch ((int)std::min<int64_t>(kAmxRows, r_end - r0)) {
#define AGRT_AMX_ROWS(R) \
  case R: tile_rows<R>(w, tile, b, x, r0, y, ldy, n0, nvalid, accumulate, bias); break;
      AGRT_AMX_ROWS(1) AGRT_AMX_ROWS(2) AGRT_AMX_ROWS(3) AGRT_AMX_ROWS(4) AGRT_AMX_ROWS(5) AGRT_AMX_ROWS(6)
      AGRT_AMX_ROWS(7) AGRT_AMX_ROWS(8) AGRT_AMX_ROWS(9) AGRT_AMX_ROWS(10) AGRT_AMX_ROWS(11) AGRT_AMX_ROWS(12)
      AGRT_AMX_ROWS(13) AGRT_AMX_ROWS(14) AGRT_AMX_ROWS(15)
#undef AGRT_AMX_ROWS
      default: tile_rows<16>(w, tile, b, x, r0, y, ldy, n0, nvalid, accumulate, bias);
    }
  }
}

#else

bool agrt::amx_usable() { return false; }
void agrt::tiles_amx(const QMat&, int64_t, const AmxRows&, int64_t, int64_t, float*, int64_t, int64_t, int, bool,
                     const float*) {}

#endif
