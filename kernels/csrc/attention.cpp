// Causal attention over the paged KV cache (float, IEEE half or int8 with a scale per token and
// head) for every query row of a step: decode, speculation verify and prefill chunks of any
// length, one call per layer. Flash-decoding: a row's keys are cut into segments of kSeg keys at
// absolute positions, each segment gives a partial softmax (its max m, its sum l, its weighted
// values o), and the partials are folded in segment order. A long decode row's segments run on
// every thread; a prefill chunk's rows fold their segments as they go.
//
// Batch invariance: a row's result is a function of its query, its key count n and the cache's
// contents only. Its arithmetic is fixed: scores in blocks of 16 keys (one fma chain over the
// head dimension per key, then one 16-way butterfly sum), each segment's softmax sums in 16-lane
// blocks from the segment's first key, its values summed key by key, and the fold in segment
// order with one formula. Which rows share a task, how many rows the chunk or batch holds,
// whether segments run on one thread or many, and how work is split over threads only decide
// which rows share the loads of a key block: never the order of any row's sums. So a prompt
// gives the same numbers cold, after a radix hit, chunked any way, batched with anything, and
// verified as a draft (tests/test_invariance.py).
//
// Sliding window (window > 0): a row with n keys attends keys [n - window, n). Segments wholly
// before n - window are skipped; in the first one the keys before n - window get probability 0.
#include <omp.h>

#include "common.h"
#include "api.h"

namespace {

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
  int64_t n(int64_t r) const { return n0 + r; }
  int64_t cut(int64_t r) const { return window > 0 ? std::max<int64_t>(0, n(r) - window) : 0; }
  int64_t lo(int64_t r) const { return std::max(j0, cut(r) / kBlock * kBlock); }  // first block
  int64_t hi(int64_t r) const { return std::min(j1, n(r)); }
  bool live(int64_t r) const { return std::max(j0, cut(r)) < hi(r); }
  int64_t first() const { return std::max(j0, cut(0) / kBlock * kBlock); }  // rows' first block
  const T* row(const T* cache, int64_t j) const {
    return cache + pt[j / S] * S * row_stride + (j % S) * row_stride + head_off;
  }
  // key rows j, j + 1, ... of one cache in order, one division per walk
  struct Rows {
    const Task& t; const T* cache; int64_t page, off; const T* at;
    Rows(const Task& t_, const T* c, int64_t j) : t(t_), cache(c), page(j / t_.S), off(j % t_.S) { seek(); }
    void seek() { at = cache + (t.pt[page] * t.S + off) * t.row_stride + t.head_off; }
    void next() {
      if (++off < t.S) {
        at += t.row_stride;
        return;
      }
      ++page, off = 0;
      seek();
    }
  };
  float* scores(int64_t r, int h) const { return sc + (r * group + h) * kSeg - j0; }  // [j0, j1)
  float* partial(int64_t r, int h) const { return part + r * prs + h * phs; }
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
    const T* src = rows.at;
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
        const float* qh = t.q + r * t.ldq + h * t.D;
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
  typename Task<T>::Rows rows(t, t.v, a < b ? a : 0);
  for (int64_t j = a; j < b; ++j, rows.next()) {
    const T* vr = rows.at;
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
        const float* qh = t.q + r * t.ldq + h * t.D;
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

struct AttnArgs {
  const float* q; const int64_t* page_table; int64_t max_pages; const int64_t* cu_q;
  const int64_t* kv_lens; const int64_t* seqs; int64_t nseq; int32_t H, Hkv, D, S; float scale;
  float* out; int64_t window; float softcap;
};

// How one sequence's rows are cut into work: a short chunk (decode, verify) runs each segment as
// a unit (its partials to a shared buffer, folded afterwards); a long one runs row blocks, each
// folding its segments as it goes.
struct SeqPlan {
  int64_t b, qlen, n0, seg0, nseg, units; bool split; int64_t part0;  // partial buffer offset (floats)
};

template <typename T>
struct Attention {
  const AttnArgs& a; const T* kc; const T* vc; int64_t row_elems;
  std::vector<SeqPlan> plans;
  int group, split, sub, hks;  // query-head shares per KV head; heads per share; KV heads per task

  Task<T> task(const SeqPlan& p, int64_t q0, int64_t hk, int64_t head0) const {
    const int64_t nr = std::min<int64_t>(kRowsPerTask, p.qlen - q0), row0 = a.cu_q[p.b] + q0;
    float* sc = agrt_scratch<float>(kSlotScores, (size_t)(nr * sub * kSeg));
    return Task<T>{kc, vc, a.page_table + p.b * a.max_pages, a.S, a.Hkv * row_elems, hk * row_elems,
                   a.q + (row0 * a.H + head0) * a.D, (int64_t)a.H * a.D, p.n0 + q0, nr, sub, a.D,
                   a.scale, sc, a.window, a.softcap, nullptr, 0, 0};
  }
  void run(const SeqPlan& p, int64_t unit, int64_t local, float* parts) const {
    for (int64_t hk = local / split * hks; hk < (local / split + 1) * hks; ++hk)
      run_head(p, unit, hk, hk * group + local % split * sub, parts);
  }
  void run_head(const SeqPlan& p, int64_t unit, int64_t hk, int64_t head0, float* parts) const {
    if (p.split) {  // one segment of every row
      Task<T> t = task(p, 0, hk, head0);
      const int64_t s = p.seg0 + unit;
      t.j0 = s * kSeg, t.j1 = (s + 1) * kSeg;
      t.part = parts + p.part0 + (head0 * p.nseg + unit) * (2 + a.D);
      t.prs = a.H * p.nseg * (2 + a.D), t.phs = p.nseg * (2 + a.D);
      run_segment(t);
      return;
    }
    Task<T> t = task(p, unit * kRowsPerTask, hk, head0);
    float* seg = agrt_scratch<float>(kSlotPartSeg, (size_t)(t.nr * sub * (2 + a.D)));
    float* st = agrt_scratch<float>(kSlotPartState, (size_t)(t.nr * sub * (2 + a.D)));
    t.part = seg, t.prs = sub * (2 + a.D), t.phs = 2 + a.D;
    const int64_t last = (t.n(t.nr - 1) + kSeg - 1) / kSeg;
    for (int64_t s = t.cut(0) / kSeg; s < last; ++s) {
      t.j0 = s * kSeg, t.j1 = (s + 1) * kSeg;
      run_segment(t);
      for (int64_t r = 0; r < t.nr; ++r)
        for (int h = 0; h < sub; ++h) {
          const float* pr = t.partial(r, h);
          if (pr[0] == -INFINITY) continue;
          fold(st + (r * sub + h) * (2 + a.D), pr, a.D, s * kSeg <= t.cut(r));
        }
    }
    const int64_t row0 = a.cu_q[p.b] + unit * kRowsPerTask;
    for (int64_t r = 0; r < t.nr; ++r)
      for (int h = 0; h < sub; ++h)
        finish(st + (r * sub + h) * (2 + a.D), a.D, a.out + ((row0 + r) * a.H + head0 + h) * a.D);
  }
  // fold a split sequence's segments (row r, head h) and write its output
  void reduce(const SeqPlan& p, int64_t r, int64_t h, float* parts) const {
    float* st = agrt_scratch<float>(kSlotPartState, (size_t)(2 + a.D));
    const float* base = parts + p.part0 + ((r * a.H + h) * p.nseg) * (2 + a.D);
    bool first = true;
    for (int64_t s = 0; s < p.nseg; ++s) {
      const float* pr = base + s * (2 + a.D);
      if (pr[0] == -INFINITY) continue;
      fold(st, pr, a.D, first);
      first = false;
    }
    finish(st, a.D, a.out + ((a.cu_q[p.b] + r) * a.H + h) * a.D);
  }
};

// Tasks go to threads round-robin (a causal chunk's later rows cost more); when there are fewer
// (segment or row block) x KV head units than threads, a KV head's query heads are shared out.
template <typename T>
void attention(const AttnArgs& a, const T* k_cache, const T* v_cache, int64_t row_elems) {
  Attention<T> at{a, k_cache, v_cache, row_elems, {}, a.H / a.Hkv, 1, 0, 1};
  int64_t units = 0, parts = 0, split_rows = 0;
  for (int64_t i = 0; i < a.nseq; ++i) {
    const int64_t b = a.seqs[i], qlen = a.cu_q[b + 1] - a.cu_q[b], n0 = a.kv_lens[b] - qlen + 1;
    const int64_t cut0 = a.window > 0 ? std::max<int64_t>(0, n0 - a.window) : 0;
    const int64_t seg0 = cut0 / kSeg, nseg = (a.kv_lens[b] + kSeg - 1) / kSeg - seg0;
    const bool split = qlen <= kRowsPerTask;
    const int64_t u = split ? nseg : (qlen + kRowsPerTask - 1) / kRowsPerTask;
    at.plans.push_back(SeqPlan{b, qlen, n0, seg0, nseg, u, split, parts});
    if (split) parts += qlen * a.H * nseg * (2 + a.D), split_rows += qlen;
    units += u;
  }
  const int threads = omp_get_max_threads();
  // enough units for every thread: a task takes all KV heads (each page's rows read whole, in
  // order); else one KV head, and when still too few, a share of its query heads
  if (units >= 4 * threads) at.hks = a.Hkv;
  while (units * a.Hkv * at.split < threads && at.group % (at.split * 2) == 0) at.split *= 2;
  at.sub = at.group / at.split;
  const int64_t per = a.Hkv / at.hks * at.split;  // tasks per unit
  int64_t* first = agrt_scratch<int64_t>(kSlotTasks, (size_t)(a.nseq + 1));
  first[0] = 0;
  for (int64_t i = 0; i < a.nseq; ++i) first[i + 1] = first[i] + at.plans[i].units * per;
  float* pbuf = agrt_scratch<float>(kSlotPartials, (size_t)std::max<int64_t>(parts, 1));
  const int64_t ntasks = first[a.nseq];
#pragma omp parallel for schedule(static, 1) if (ntasks > 1)
  for (int64_t task = 0; task < ntasks; ++task) {
    const int64_t i = std::upper_bound(first, first + a.nseq + 1, task) - first - 1;
    const int64_t local = task - first[i];
    at.run(at.plans[i], local / per, local % per, pbuf);
  }
  if (split_rows == 0) return;
  const int64_t nred = split_rows * a.H;  // (row, head) pairs of split sequences
#pragma omp parallel for schedule(static) if (nred > 8)
  for (int64_t u = 0; u < nred; ++u) {
    int64_t rest = u / a.H;
    for (const SeqPlan& p : at.plans) {
      if (!p.split) continue;
      if (rest < p.qlen) {
        at.reduce(p, rest, u % a.H, pbuf);
        break;
      }
      rest -= p.qlen;
    }
  }
}

}  // namespace

extern "C" {

// Causal attention over paged KV for the sequences listed in seqs[nseq]: sequence b has
// q_len = cu_q[b+1] - cu_q[b] queries (rows cu_q[b].. of q [T, H, D]) at the last q_len of its
// kv_lens[b] positions, whose pages are page_table[b, :]. Writes the same rows of out [T, H, D].
// kv_mode: 0 float, 1 IEEE half, 2 int8 (each head's row: D int8, then a float scale per group
// of 32).
// window > 0: each query attends its last `window` keys only; softcap > 0: scores pass through
// softcap * tanh(score / softcap) before the softmax.
void agrt_attention(const float* q, const void* k_cache, const void* v_cache,
                    const int64_t* page_table, int64_t max_pages, const int64_t* cu_q,
                    const int64_t* kv_lens, const int64_t* seqs, int64_t nseq, int32_t H,
                    int32_t Hkv, int32_t D, int32_t S, float scale, float* out, int32_t kv_mode,
                    int32_t window, float softcap) {
  const AttnArgs a{q, page_table, max_pages, cu_q, kv_lens, seqs, nseq, H, Hkv, D, S, scale, out, window,
                   softcap};
  if (kv_mode == 2)
    attention(a, static_cast<const int8_t*>(k_cache), static_cast<const int8_t*>(v_cache),
              (int64_t)D + 4 * kv_groups(D));
  else if (kv_mode == 1)
    attention(a, static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache), (int64_t)D);
  else
    attention(a, static_cast<const float*>(k_cache), static_cast<const float*>(v_cache), (int64_t)D);
}

}  // extern "C"
