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
// order with one formula (attention_seg.h). Which rows share a task, how many rows the chunk or
// batch holds, whether segments run on one thread or many, and how work is split over threads
// only decide which rows share the loads of a key block: never the order of any row's sums. So a prompt
// gives the same numbers cold, after a radix hit, chunked any way, batched with anything, and
// verified as a draft (tests/test_invariance.py).
//
// Sliding window (window > 0): a row with n keys attends keys [n - window, n). Segments wholly
// before n - window are skipped; in the first one the keys before n - window get probability 0.
//
// Shared segments (cascade attention): decode rows of different sequences whose page tables hold
// the same pages for a whole segment (a prefix the radix cache shares: agents' system prompt and
// tools) run that segment as one task, so its keys and values are read once for all of them.
#include <omp.h>

#include <unordered_map>

#include "common.h"
#include "api.h"
#include "attention_seg.h"

namespace {

using namespace agrt_attn;

struct AttnArgs {
  const float* q; const int64_t* page_table; int64_t max_pages; const int64_t* cu_q;
  const int64_t* kv_lens; const int64_t* seqs; int64_t nseq; int32_t H, Hkv, D, S; float scale;
  float* out; int64_t window; float softcap;
};

// How one sequence's rows are cut into work: a short chunk (decode, verify: `split`) runs each
// segment as its own job (partials to a shared buffer, [row][segment][head], folded afterwards);
// a long one runs row blocks, each folding its segments as it goes.
struct SeqPlan {
  int64_t b, qlen, n0, seg0, nseg; bool split; int64_t part0;  // partial buffer offset (floats)
  int64_t cut_last;  // the first key its last row sees
};

// One segment of some split sequences' rows: one sequence's (any segment), or several whose
// tables share the segment's pages and whose every row sees all of it (`shared`).
struct SegJob {
  int64_t s; bool shared; std::vector<std::pair<int64_t, int64_t>> rows;  // (plan, row)
};

// A unit of work: a split job, or a row block of a long sequence.
struct Item { bool job; int64_t idx, unit; };

template <typename T>
struct Attention {
  const AttnArgs& a; const T* kc; const T* vc; int64_t row_elems;
  std::vector<SeqPlan> plans;
  std::vector<SegJob> jobs;
  std::vector<Item> items;
  int group = 1, split = 1, sub = 1, hks = 1;  // query-head shares per KV head; heads per share; KV heads per task
  float* parts = nullptr;

  Task<T> base(const SeqPlan& p, int64_t q0, int64_t nr, int64_t hk, int64_t head0) const {
    float* sc = agrt_scratch<float>(kSlotScores, (size_t)(nr * sub * kSeg));
    const int64_t row0 = a.cu_q[p.b] + q0;
    return Task<T>{kc, vc, a.page_table + p.b * a.max_pages, a.S, a.Hkv * row_elems, hk * row_elems,
                   a.q + (row0 * a.H + head0) * a.D, (int64_t)a.H * a.D, p.n0 + q0, nr, sub, a.D,
                   a.scale, sc, a.window, a.softcap, nullptr, 0, 0};
  }
  float* partial(const SeqPlan& p, int64_t row, int64_t u, int64_t head) const {
    return parts + p.part0 + ((row * p.nseg + u) * a.H + head) * (2 + a.D);
  }
  void run(const Item& it, int64_t local) const {
    for (int64_t hk = local / split * hks; hk < (local / split + 1) * hks; ++hk) {
      const int64_t head0 = hk * group + local % split * sub;
      if (it.job)
        run_job(jobs[it.idx], hk, head0);
      else
        run_block(plans[it.idx], it.unit, hk, head0);
    }
  }
  void run_job(const SegJob& j, int64_t hk, int64_t head0) const {
    const float* qr[kRowsPerTask];
    float* pr[kRowsPerTask];
    const int64_t nr = (int64_t)j.rows.size();
    for (int64_t r = 0; r < nr; ++r) {
      const SeqPlan& p = plans[j.rows[r].first];
      qr[r] = a.q + ((a.cu_q[p.b] + j.rows[r].second) * a.H + head0) * a.D;
      pr[r] = partial(p, j.rows[r].second, j.s - p.seg0, head0);
    }
    const SeqPlan& p0 = plans[j.rows[0].first];
    Task<T> t = base(p0, 0, nr, hk, head0);
    t.j0 = j.s * kSeg, t.j1 = (j.s + 1) * kSeg;
    t.qr = qr, t.pr = pr, t.phs = 2 + a.D;
    if (j.shared)  // (every row sees the whole segment: as a row with keys up to its end)
      t.n0 = t.j1, t.window = 0;
    run_segment(t);
  }
  void run_block(const SeqPlan& p, int64_t unit, int64_t hk, int64_t head0) const {
    const int64_t q0 = unit * kRowsPerTask;
    Task<T> t = base(p, q0, std::min<int64_t>(kRowsPerTask, p.qlen - q0), hk, head0);
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
    const int64_t row0 = a.cu_q[p.b] + q0;
    for (int64_t r = 0; r < t.nr; ++r)
      for (int h = 0; h < sub; ++h)
        finish(st + (r * sub + h) * (2 + a.D), a.D, a.out + ((row0 + r) * a.H + head0 + h) * a.D);
  }
  // fold a split sequence's segments (row r, head h) and write its output
  void reduce(const SeqPlan& p, int64_t r, int64_t h) const {
    float* st = agrt_scratch<float>(kSlotPartState, (size_t)(2 + a.D));
    bool first = true;
    for (int64_t u = 0; u < p.nseg; ++u) {
      const float* pr = partial(p, r, u, h);
      if (pr[0] == -INFINITY) continue;
      fold(st, pr, a.D, first);
      first = false;
    }
    finish(st, a.D, a.out + ((a.cu_q[p.b] + r) * a.H + h) * a.D);
  }

  // The split sequences' segment jobs: a whole segment over the same pages in several sequences
  // is one job (up to kRowsPerTask rows); any other segment is its sequence's own.
  void plan_jobs() {
    // whole segments by their first page: (the segment's pages, job); one hash lookup a segment
    std::unordered_multimap<int64_t, std::pair<const int64_t*, int64_t>> open;
    const int64_t per_seg = kSeg % a.S == 0 ? kSeg / a.S : 0;
    for (int64_t i = 0; i < (int64_t)plans.size(); ++i) {
      const SeqPlan& p = plans[i];
      if (!p.split) continue;
      for (int64_t u = 0; u < p.nseg; ++u) {
        const int64_t s = p.seg0 + u;
        const bool whole = per_seg > 0 && a.nseq > 1 && s * kSeg >= p.cut_last && (s + 1) * kSeg <= p.n0;
        int64_t at = -1;
        const int64_t* pt = a.page_table + p.b * a.max_pages + s * per_seg;
        if (whole) {
          const auto range = open.equal_range(pt[0]);
          for (auto o = range.first; o != range.second; ++o)
            if (std::equal(pt, pt + per_seg, o->second.first) &&
                (int64_t)jobs[o->second.second].rows.size() + p.qlen <= kRowsPerTask)
              at = o->second.second;
        }
        if (at < 0) {
          at = (int64_t)jobs.size();
          jobs.push_back(SegJob{s, false, {}});
          if (whole) open.emplace(pt[0], std::make_pair(pt, at));
        } else {
          jobs[at].shared = true;
        }
        for (int64_t r = 0; r < p.qlen; ++r) jobs[at].rows.emplace_back(i, r);
      }
    }
  }
};

// Tasks go to threads round-robin (a causal chunk's later rows cost more); when there are fewer
// units (jobs and row blocks) x KV heads than threads, a KV head's query heads are shared out.
template <typename T>
void attention(const AttnArgs& a, const T* k_cache, const T* v_cache, int64_t row_elems) {
  Attention<T> at{a, k_cache, v_cache, row_elems};
  at.group = a.H / a.Hkv;
  int64_t nparts = 0, split_rows = 0;
  for (int64_t i = 0; i < a.nseq; ++i) {
    const int64_t b = a.seqs[i], qlen = a.cu_q[b + 1] - a.cu_q[b], n0 = a.kv_lens[b] - qlen + 1;
    auto cut = [&](int64_t n) { return a.window > 0 ? std::max<int64_t>(0, n - a.window) : 0; };
    const int64_t seg0 = cut(n0) / kSeg, nseg = (a.kv_lens[b] + kSeg - 1) / kSeg - seg0;
    const bool split = qlen <= kRowsPerTask;
    at.plans.push_back(SeqPlan{b, qlen, n0, seg0, nseg, split, nparts, cut(a.kv_lens[b])});
    if (split) {
      nparts += qlen * a.H * nseg * (2 + a.D), split_rows += qlen;
    } else {
      for (int64_t u = 0; u < (qlen + kRowsPerTask - 1) / kRowsPerTask; ++u) at.items.push_back(Item{false, i, u});
    }
  }
  at.plan_jobs();
  for (int64_t j = 0; j < (int64_t)at.jobs.size(); ++j) at.items.push_back(Item{true, j, 0});
  const int64_t units = (int64_t)at.items.size();
  const int threads = omp_get_max_threads();
  // enough units for every thread: a task takes all KV heads (each page's rows read whole, in
  // order); else one KV head, and when still too few, a share of its query heads
  if (units >= 4 * threads) at.hks = a.Hkv;
  while (units * a.Hkv * at.split < threads && at.group % (at.split * 2) == 0) at.split *= 2;
  at.sub = at.group / at.split;
  const int64_t per = a.Hkv / at.hks * at.split;  // tasks per unit
  at.parts = agrt_scratch<float>(kSlotPartials, (size_t)std::max<int64_t>(nparts, 1));
  const int64_t ntasks = units * per;
#pragma omp parallel for schedule(static, 1) if (ntasks > 1)
  for (int64_t task = 0; task < ntasks; ++task) at.run(at.items[task / per], task % per);
  if (split_rows == 0) return;
  std::vector<std::pair<int64_t, int64_t>> rows;  // (plan, row) of the split sequences
  for (int64_t i = 0; i < (int64_t)at.plans.size(); ++i)
    if (at.plans[i].split)
      for (int64_t r = 0; r < at.plans[i].qlen; ++r) rows.emplace_back(i, r);
  const int64_t nred = split_rows * a.H;
#pragma omp parallel for schedule(static) if (nred > 8)
  for (int64_t u = 0; u < nred; ++u) at.reduce(at.plans[rows[u / a.H].first], rows[u / a.H].second, u % a.H);
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
