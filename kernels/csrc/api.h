// The C ABI of the agentrt CPU kernels (ctypes signatures in kernels/native.py).
#pragma once
#include <cstdint>

extern "C" {
int agrt_has_vnni(void);
int agrt_has_amx(void);  // the AMX kernel can run (the CPU has it, the kernel granted it; qgemm.cpp: where)
void agrt_qgemm(const float* x, int64_t M, int64_t K, int64_t ldx, const uint8_t* q, const void* s,
                const void* m, int32_t half, int32_t z, int32_t bits, int32_t G, int64_t N, float* y,
                int64_t ldy, int32_t accumulate, const float* bias, int32_t precise);
void agrt_qrefine(const float* x, int64_t M, int64_t K, int64_t ldx, const uint8_t* q, const void* s,
                  const void* m, int32_t half, int32_t z, int32_t bits, int32_t G, int64_t N, float* y,
                  int64_t ldy, int32_t k);
void agrt_qrows(const uint8_t* q, const void* s, const void* m, int32_t half, int32_t z, int32_t bits,
                int32_t G, int64_t K, const int64_t* rows, int64_t R, float* out);
void agrt_rmsnorm(const float* x, int64_t T, int64_t Dm, int64_t ldx, const float* w, float eps,
                  float* out);
void agrt_rope_store(const float* qkv, int64_t T, int32_t H, int32_t Hkv, int32_t D, const int64_t* pos,
                     const float* cos_t, const float* sin_t, const int64_t* slot, const float* q_norm,
                     const float* k_norm, float eps, void* k_cache, void* v_cache, float* q_out,
                     int32_t kv_mode);
void agrt_attention(const float* q, const void* k_cache, const void* v_cache, const int64_t* page_table,
                    int64_t max_pages, const int64_t* cu_q, const int64_t* kv_lens, const int64_t* seqs,
                    int64_t nseq, int32_t H, int32_t Hkv, int32_t D, int32_t S, float scale, float* out,
                    int32_t kv_mode, int32_t window, float softcap);
void agrt_argmax(const float* x, int64_t M, int64_t N, int64_t ldx, int64_t* out);
void agrt_apply_bitmask(float* x, const int32_t* words, int64_t n);
void agrt_silu_mul(const float* gu, int64_t T, int64_t I, float* out);
void agrt_gelu_mul(const float* gu, int64_t T, int64_t I, float* out);
struct AgrtMoe;
struct AgrtLoraStep;
void agrt_moe(const AgrtMoe* moe, const float* h, int64_t T, int64_t hidden, float* x);
// y[rows of each segment, part columns] += LoRA(x) for projection `proj` (0 qkv, 1 o, 2 gate_up,
// 3 down) of `layer` (csrc/lora.cpp)
void agrt_lora(const AgrtLoraStep* st, int32_t layer, int32_t proj, const float* x, int64_t ldx, float* y,
               int64_t ldy);
}

// One quantized weight part / linear layer / decoder layer, as laid out by kernels/native.py.
struct AgrtPart {
  const uint8_t* q; const void* s; const void* m;  // s, m: fp16 when half, else fp32
  int32_t z, bits, group, half; int64_t n, k;
};
struct AgrtLinear {
  AgrtPart parts[3]; int32_t nparts, precise; const float* bias; int64_t n_out;
};
struct AgrtLayer {
  const float* attn_norm; const float* mlp_norm; AgrtLinear qkv, o, gate_up, down;
  const float* q_norm; const float* k_norm;  // per-head q/k RMSNorm weights [head_dim] (Qwen3), or null
  const struct AgrtMoe* moe;  // mixture-of-experts MLP (csrc/moe.cpp) instead of gate_up/down, or null
  int32_t window;  // sliding-window attention: the keys each query sees (0: all)
  // Gemma: norms of the attention's / MLP's output before the residual add (or null), this
  // layer's RoPE tables (Gemma 3's local layers; null: the call's), GeGLU, attention softcap
  const float* attn_post_norm; const float* mlp_post_norm; const float* cos; const float* sin;
  int32_t gelu; float softcap;
};
// A mixture-of-experts MLP: router [n_experts, hidden] fp32, the experts' gate_up [2 * inter
// out] and down [hidden out] linears (n_experts each).
struct AgrtMoe {
  const float* router; const AgrtLinear* gate_up; const AgrtLinear* down;
  int32_t n_experts, top_k, norm_topk; int64_t inter;
};
// LoRA adapters (csrc/lora.cpp; agentrt/adapters/native.py lays them out). One target of one
// layer: A [rank, n_in], B stored transposed [rank, n_out] (the scaling folded in), fp32 or bf16;
// it adds into output columns [col, col + n_out) of its fused projection.
struct AgrtLoraPart {
  const void* a; const void* b; int32_t rank, bf16; int64_t n_in, n_out, col;
};
// An adapter: its parts, (layer, projection) i's being parts[index[i] .. index[i + 1]), i = layer * 4 + proj.
struct AgrtAdapter {
  const AgrtLoraPart* parts; const int32_t* index; int32_t nlayers;
};
// A step's rows [r0, r1) that run `adapter`, and all of them.
struct AgrtLoraSeg { int64_t r0, r1; const AgrtAdapter* adapter; };
struct AgrtLoraStep { const AgrtLoraSeg* segs; int32_t nseg; };
namespace agrt {
// y (+)= x @ W^T of a linear layer (each part in turn; layers.cpp)
void linear(const AgrtLinear& l, const float* x, int64_t T, int64_t ldx, float* y, int64_t ldy, bool accumulate);
// y[M, ldy] = x[M, K] (row stride ldx) @ W^T for one weight part: a job of qgemm_group
struct GemmJob { const float* x; int64_t M, ldx; const AgrtPart* p; float* y; int64_t ldy; };
// every job's tiles in one parallel loop (qgemm.cpp); each job's numbers are agrt_qgemm's own
void qgemm_group(const GemmJob* jobs, int n);
}  // namespace agrt
struct AgrtDims {
  int32_t hidden, inter, heads, kv_heads, head_dim, page_size; float eps, scale;
  int32_t kv_mode;  // the KV caches hold 0 float, 1 IEEE half, 2 int8 rows with a scale
};
