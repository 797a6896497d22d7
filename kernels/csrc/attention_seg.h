// The flash-decoding attention's per-segment arithmetic (attention.cpp plans the work): one
// task's rows x the keys of one segment -> each (row, head)'s partial softmax (m, l, o), and the
// fold of partials in segment order. Every function's sums run in an order fixed by the row
// alone (attention.cpp's header says why that matters).
#pragma once
#include <type_traits>

#include "common.h"

namespace agrt_attn {

constexpr int64_t kBlock = 16;  // keys per score block
constexpr int64_t kSeg = 256;    // keys per segment, a multiple of kBlock (64: per-segment costs made prefill
                                 // attention ~35% slower; decode alike)
constexpr int64_t kRowsPerTask = 16;  // rows sharing each key block's loads (not their sums)

// int8 KV rows: D int8 values, then one float scale per group of 32 of them (kKvGroup, the
// last group may be shorter): D + 4 * kv_groups(D) bytes
inline float scale_at(const int8_t* row, int D, int d) {
  float s;
  std::memcpy(&s, row + D + 4 * (d / kKvGroup), sizeof s);
  return s;
}
inline float to_float(float x) { return x; }
inline float to_float(uint16_t x) { return agrt_half_to_float(x); }
template <typename T> inline float value_at(const T* row, int, int d) { return to_float(row[d]); }
inline float value_at(const int8_t* row, int D, int d) { return (float)row[d] * scale_at(row, D, d); }

// One task's rows: rows r0..r0+nr-1 of sequence b (row r sees keys [cut(r), n(r))), `group`
// query heads of one KV head, over the keys [j0, j1) of one segment. Each (row, head)'s partial
// goes to part(r, h): m, l, then o[D].
template <typename T>
struct Task {
  const T* k; const T* v; const int64_t* pt;  // caches; the sequence's page table
  int64_t S, row_stride, head_off;            // page size; cache row stride; this KV head's offset
  const float* q; int64_t ldq;                // rows' first query head; row stride
  int64_t n0, nr;                             // keys of the first row; rows
  int group, D; float scale; float* sc;       // scores [nr][group][kSeg]
  int64_t window; float softcap;
  float* part; int64_t prs, phs;              // partials: row and head strides
  int64_t j0 = 0, j1 = 0;                     // the segment
  const float* const* qr = nullptr;           // per-row query and partial pointers, when the rows
  float* const* pr = nullptr;                 // come from several sequences (a shared segment)
  int64_t n(int64_t r) const { return n0 + r; }
  int64_t cut(int64_t r) const { return window > 0 ? std::max<int64_t>(0, n(r) - window) : 0; }
  int64_t lo(int64_t r) const { return std::max(j0, cut(r) / kBlock * kBlock); }  // first block
  int64_t hi(int64_t r) const { return std::min(j1, n(r)); }
  bool live(int64_t r) const { return std::max(j0, cut(r)) < hi(r); }
  int64_t first() const { return std::max(j0, cut(0) / kBlock * kBlock); }  // rows' first block
  const T* row(const T* cache, int64_t j) const {
    return cache + pt[j / S] * S * row_stride + (j % S) * row_stride + head_off;
  }
  // key rows j, j + 1, ... of one cache in order, one division per walk; a page's entry in the
  // table is read when its first row is (never past the last row walked)
  struct Rows {
    const Task& t; const T* cache; int64_t page, off, loaded = -1; const T* base = nullptr;
    Rows(const Task& t_, const T* c, int64_t j) : t(t_), cache(c), page(j / t_.S), off(j % t_.S) {}
    const T* at() {
      if (loaded != page) base = cache + t.pt[page] * t.S * t.row_stride + t.head_off, loaded = page;
      return base + off * t.row_stride;
    }
    void next() {
      if (++off == t.S) ++page, off = 0;
    }
  };
  float* scores(int64_t r, int h) const { return sc + (r * group + h) * kSeg - j0; }  // [j0, j1)
  float* partial(int64_t r, int h) const { return (pr ? pr[r] : part + r * prs) + h * phs; }
  const float* query(int64_t r, int h) const { return (qr ? qr[r] : q + r * ldq) + h * D; }
};

#ifdef __AVX512F__
// values [d, d + 16) of one head's row as floats
inline __m512 load16(const float* row, int, int d) { return _mm512_loadu_ps(row + d); }
inline __m512 load16(const uint16_t* row, int, int d) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(row + d)));
}
inline __m512 load16(const int8_t* row, int D, int d) {  // (d % 16 == 0: one scale group)
  const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(row + d))));
  return _mm512_mul_ps(x, _mm512_set1_ps(scale_at(row, D, d)));
}
#endif

// keys [jb, jb + 16) as floats in kf[16][D] (keys past the segment or the rows: zeros)
template <typename T>
void key_block(const Task<T>& t, int64_t jb, int64_t end, float* kf) {
  const int64_t live = std::min(kBlock, end - jb);
  std::fill(kf + live * t.D, kf + kBlock * t.D, 0.f);
  typename Task<T>::Rows rows(t, t.k, jb);
  for (int64_t i = 0; i < live; ++i, rows.next()) {
    float* dst = kf + i * t.D;
    const T* src = rows.at();
    int d = 0;
#ifdef __AVX512F__
    for (; d + 16 <= t.D; d += 16) _mm512_storeu_ps(dst + d, load16(src, t.D, d));
#endif
    for (; d < t.D; ++d) dst[d] = value_at(src, t.D, d);
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
  const int64_t end = std::min(t.j1, t.n(t.nr - 1));
  for (int64_t jb = t.first(); jb < end; jb += kBlock) {
    key_block(t, jb, end, kf);
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t live = std::min<int64_t>(kBlock, t.hi(r) - jb);
      if (live <= 0 || jb < t.lo(r)) continue;
      const __mmask16 mask = (__mmask16)((1u << live) - 1u);
      for (int h = 0; h < t.group; ++h) {
        const float* qh = t.query(r, h);
        __m512 qs[NV];
        for (int c = 0; c < NV; ++c) qs[c] = _mm512_mul_ps(_mm512_loadu_ps(qh + 16 * c), _mm512_set1_ps(t.scale));
        _mm512_mask_storeu_ps(t.scores(r, h) + jb, mask, score_block<NV>(qs, kf));
      }
    }
  }
}

// o[u] += sum_j p[u][j] * v_j over keys [a, b) for U (row, head) units, each value row loaded
// once for all of them (o[u] from 0 when !resume).
template <int NV, int U, typename T>
void values_units(const Task<T>& t, const int64_t* ur, const int* uh, int64_t a, int64_t b, bool resume) {
  __m512 acc[U][NV];
  const float* p[U];
  float* o[U];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u) {
    p[u] = t.scores(ur[u], uh[u]);
    o[u] = t.partial(ur[u], uh[u]) + 2;
    for (int c = 0; c < NV; ++c) acc[u][c] = resume ? _mm512_loadu_ps(o[u] + 16 * c) : _mm512_setzero_ps();
  }
  typename Task<T>::Rows rows(t, t.v, a);
  for (int64_t j = a; j < b; ++j, rows.next()) {
    const T* vr = rows.at();
    __m512 vv[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) vv[c] = load16(vr, t.D, 16 * c);
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

template <int NV, int U, typename T>
void values_some(const Task<T>& t, int cnt, const int64_t* ur, const int* uh, int64_t a, int64_t b) {
  if constexpr (U > 1) {
    if (cnt < U) return values_some<NV, U - 1>(t, cnt, ur, uh, a, b);
  }
  values_units<NV, U>(t, ur, uh, a, b, false);
}

// Units in groups of U share each value row up to the group's fewest keys; each then finishes
// its own keys alone. Every unit's sum runs key by key from the segment's first block either way
// (a row whose keys start later has p = 0 there).
template <int NV, int U, typename T>
void values_avx(const Task<T>& t) {
  const int64_t nu = t.nr * t.group, a = t.first();
  for (int64_t u0 = 0; u0 < nu; u0 += U) {
    const int cnt = (int)std::min<int64_t>(U, nu - u0);
    int64_t ur[U];
    int uh[U];
    for (int i = 0; i < U; ++i) {
      const int64_t u = u0 + std::min(i, cnt - 1);  // (a short group repeats its last unit)
      ur[i] = u / t.group, uh[i] = (int)(u % t.group);
    }
    const int64_t shared = std::max(a, t.hi(ur[0]));  // units are row-major: the first row has the fewest keys
    values_some<NV, U>(t, cnt, ur, uh, a, shared);
    for (int i = 0; i < cnt; ++i)
      if (t.hi(ur[i]) > shared) values_units<NV, 1>(t, ur + i, uh + i, shared, t.hi(ur[i]), true);
  }
}
#endif

// The portable loops: the same order of sums (blocks of 16 keys, lanes summed by the same tree).
template <typename T>
void scores_generic(const Task<T>& t, float* kf) {
  float lanes[16][16];
  const int64_t end = std::min(t.j1, t.n(t.nr - 1));
  for (int64_t jb = t.first(); jb < end; jb += kBlock) {
    key_block(t, jb, end, kf);
    for (int64_t r = 0; r < t.nr; ++r) {
      const int64_t live = jb < t.lo(r) ? 0 : std::min<int64_t>(kBlock, t.hi(r) - jb);
      for (int h = 0; h < t.group && live > 0; ++h) {
        const float* qh = t.query(r, h);
        for (int64_t i = 0; i < live; ++i) {
          for (int l = 0; l < 16; ++l) lanes[i][l] = 0.f;  // (D < 16: the lanes past D stay 0)
          for (int d = 0; d < t.D; ++d) {  // lane d % 16: a product, then fused multiply-adds
            const float qd = qh[d] * t.scale, kd = kf[i * t.D + d];
            lanes[i][d % 16] = d < 16 ? qd * kd : std::fma(qd, kd, lanes[i][d % 16]);
          }
          float a[8];
          for (int l = 0; l < 8; ++l) a[l] = lanes[i][l] + lanes[i][l + 8];
          float b[4] = {a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]};
          t.scores(r, h)[jb + i] = (b[0] + b[2]) + (b[1] + b[3]);
        }
      }
    }
  }
}

template <typename T>
void values_generic(const Task<T>& t) {
  for (int64_t r = 0; r < t.nr; ++r)
    for (int h = 0; h < t.group; ++h) {
      float* o = t.partial(r, h) + 2;
      const float* p = t.scores(r, h);
      std::fill(o, o + t.D, 0.f);
      for (int64_t j = t.first(); j < t.hi(r); ++j) {
        const T* vr = t.row(t.v, j);
        for (int d = 0; d < t.D; ++d) o[d] = std::fma(p[j], value_at(vr, t.D, d), o[d]);
      }
    }
}

// p[lo, hi) <- exp(p - m) with m = max p[cut, hi), keys before cut 0; returns (m, sum p) with the
// sum in 16-lane blocks from lo, then the tail key by key.
inline void softmax_partial(float* p, int64_t lo, int64_t cut, int64_t hi, float* ml) {
  std::fill(p + lo, p + cut, -INFINITY);
  float mx = -INFINITY;  // (max: exact in any order)
  int64_t k = lo;
#ifdef __AVX512F__
  __m512 mvec = _mm512_set1_ps(-INFINITY);
  for (; k + 16 <= hi; k += 16) mvec = _mm512_max_ps(mvec, _mm512_loadu_ps(p + k));
  mx = _mm512_reduce_max_ps(mvec);
#endif
  for (; k < hi; ++k) mx = std::max(mx, p[k]);
  float total = 0.f;
  int64_t j = lo;
#ifdef __AVX512F__
  const __m512 mv = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  for (; j + 16 <= hi; j += 16) {
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(p + j), mv));
    _mm512_storeu_ps(p + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; j < hi; ++j) {
    p[j] = std::exp(p[j] - mx);
    total += p[j];
  }
  std::fill(p + lo, p + cut, 0.f);  // (exp_ps clamps: a masked key's e^-87 is not 0)
  ml[0] = mx, ml[1] = total;
}

// The segment [t.j0, t.j1)'s partials of every (row, head) of the task; a row with no key there
// gets m = -inf (skipped by the fold).
template <typename T>
void run_segment(const Task<T>& t) {
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
  const int64_t a = t.first();
  for (int64_t r = 0; r < t.nr; ++r)
    for (int h = 0; h < t.group; ++h) {
      float* p = t.scores(r, h);
      float* ml = t.partial(r, h);
      if (!t.live(r)) {  // (its p joins shared value loads as zeros)
        std::fill(p + a, p + t.j1, 0.f);
        ml[0] = -INFINITY, ml[1] = 0.f;
        continue;
      }
      const int64_t cut = std::max(t.j0, t.cut(r));
      if (t.softcap > 0.f)  // (Gemma 2: before the mask, as its reference does)
        for (int64_t j = cut; j < t.hi(r); ++j) p[j] = t.softcap * std::tanh(p[j] / t.softcap);
      softmax_partial(p, t.lo(r), cut, t.hi(r), ml);
      std::fill(p + a, p + t.lo(r), 0.f);  // (rows sharing value loads from the first block)
    }
#ifdef __AVX512F__
  if (t.D == 64) return values_avx<4, 6>(t);
  if (t.D == 128) return values_avx<8, 3>(t);
  if (t.D == 256) return values_avx<16, 1>(t);
#endif
  values_generic(t);
}

// (m, l, o) <- the fold of (m, l, o) and a later segment's (ms, ls, os): one formula for every
// path. `first`: the row's first segment, copied.
inline void fold(float* st, const float* seg, int D, bool first) {
  if (first) {
    std::copy(seg, seg + 2 + D, st);
    return;
  }
  const float m = std::max(st[0], seg[0]);
  const float a = st[0] == m ? 1.f : std::exp(st[0] - m), b = seg[0] == m ? 1.f : std::exp(seg[0] - m);
  st[0] = m, st[1] = st[1] * a + seg[1] * b;
  int d = 0;
#ifdef __AVX512F__
  const __m512 av = _mm512_set1_ps(a), bv = _mm512_set1_ps(b);
  for (; d + 16 <= D; d += 16)
    _mm512_storeu_ps(st + 2 + d, _mm512_fmadd_ps(_mm512_loadu_ps(seg + 2 + d), bv,
                                                 _mm512_mul_ps(_mm512_loadu_ps(st + 2 + d), av)));
#endif
  for (; d < D; ++d) st[2 + d] = std::fma(seg[2 + d], b, st[2 + d] * a);
}

inline void finish(const float* st, int D, float* out) {
  const float inv = 1.f / st[1];
  for (int d = 0; d < D; ++d) out[d] = st[2 + d] * inv;
}

}  // namespace agrt_attn
