// Single-row work on packed quantized weights, in fp32: the output head's top-k refinement and
// the dequantized rows of a quantized embedding table.
#include "common.h"
#include "api.h"
#include "qmat.h"

using agrt::QMat;

extern "C" {

// y[M, N] (row stride ldy) holds x @ W^T with int8 activations; the k largest values of each row
// are recomputed from the fp32 activations x (row stride ldx) and the dequantized weight rows:
// the output head's greedy argmax is then the fp32-activation argmax whenever that token is
// among the int8-activation top k, for ~k/N of the GEMM's work. Ties keep the lower index.
void agrt_qrefine(const float* x, int64_t M, int64_t K, int64_t ldx, const uint8_t* q, const void* s,
                  const void* m, int32_t half, int32_t z, int32_t bits, int32_t G, int64_t N, float* y,
                  int64_t ldy, int32_t k) {
  const QMat w{q, s, m, z, bits, G, half, K};
  const int64_t ng = K / G;
  k = (int32_t)std::min<int64_t>(std::max(k, 0), std::min<int64_t>(N, 64));
#pragma omp parallel for schedule(static) if (M > 1)
  for (int64_t r = 0; r < M; ++r) {
    float* yr = y + r * ldy;
    int64_t top[64];
    int cnt = 0;
    for (int64_t n = 0; n < N; ++n) {  // insertion into the k best (descending)
      if (cnt == k && !(yr[n] > yr[top[k - 1]])) continue;
      int at = cnt < k ? cnt++ : k - 1;
      while (at > 0 && yr[n] > yr[top[at - 1]]) {
        top[at] = top[at - 1];
        --at;
      }
      top[at] = n;
    }
    const float* xr = x + r * ldx;
    for (int i = 0; i < cnt; ++i) {
      const int64_t n = top[i], tile = n / 16;
      const int c = (int)(n % 16);
      const uint8_t* wt = q + tile * w.tile_bytes();
      float acc = 0.f;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t si = (tile * ng + g) * 16 + c;
        const float sc = w.scale(si), mn = m ? w.min(si) : 0.f;
        for (int64_t j = g * G; j < (g + 1) * G; ++j)
          acc += xr[j] * (sc * (float)((int32_t)w.q_at(wt, c, j) - z) + mn);
      }
      yr[n] = acc;
    }
  }
}

// Dequantize output rows `rows[R]` of W (i.e. rows of the [N, K] matrix) into out[R, K]:
// the embedding lookup of a quantized (tied) embedding table.
void agrt_qrows(const uint8_t* q, const void* s, const void* m, int32_t half, int32_t z,
                int32_t bits, int32_t G, int64_t K, const int64_t* rows, int64_t R, float* out) {
  const QMat w{q, s, m, z, bits, G, half, K};
  const int64_t ng = K / G;
#pragma omp parallel for schedule(static) if (R > 8)
  for (int64_t i = 0; i < R; ++i) {
    const int64_t n = rows[i], tile = n / 16;
    const int c = (int)(n % 16);
    const uint8_t* wt = q + tile * w.tile_bytes();
    for (int64_t k = 0; k < K; ++k) {
      const int64_t si = (tile * ng + k / G) * 16 + c;
      float v = w.scale(si) * (float)((int32_t)w.q_at(wt, c, k) - z);
      if (m) v += w.min(si);
      out[i * K + k] = v;
    }
  }
}

}  // extern "C"
