// model/kernels/attention_cpu_products.h — the products of one head's attention on one thread, as
// the CPU attention kernel's tile loop (attention_cpu.cpp) asks for them: in float32 FMAs
// (attention_cpu.cpp) or in bf16 dot products (attention_cpu_bf16.cpp, CPUs with AVX512-BF16).
// Internal to model/kernels.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <memory>

namespace titan::model::kernels {

// One object per thread, reused across its heads. Shapes: the head's kv_len keys, qk_head_dim
// columns of q and k, v_head_dim of v, out and dout (See Note [Attention head sizes and scale] in
// attention.h), tiles of up to tile_rows queries; `keys` below is the tile's visible prefix of
// the keys (causal) or all of them. Every float32 matrix is row-major and dense (ld = its width).
class HeadProducts {
 public:
  virtual ~HeadProducts() = default;
  // One kv head's keys and values, rows `stride` elements apart: packed for every product.
  virtual void load_kv(const at::BFloat16* k, int64_t k_stride, const at::BFloat16* v, int64_t v_stride) = 0;
  // The tile's queries and (backward) their output gradients, rows `stride` apart.
  virtual void load_q(const at::BFloat16* q, int64_t stride, int64_t rows) = 0;
  virtual void load_dout(const at::BFloat16* dout, int64_t stride, int64_t rows) = 0;
  virtual void scores(int64_t rows, int64_t keys, float* s) = 0;                    // s [rows, keys] = q k^T
  virtual void out(int64_t rows, int64_t keys, const float* p, float* o) = 0;       // o [rows, v_hd] = p v
  virtual void grad_probs(int64_t rows, int64_t keys, float* dp) = 0;               // dp [rows, keys] = dO v^T
  virtual void grad_q(int64_t rows, int64_t keys, const float* ds, float* dq) = 0;  // dq [rows, qk_hd] = ds k
  // dk [keys, qk_hd] += ds^T q and dv [keys, v_hd] += p^T dO (the tile's queries and gradients).
  virtual void grad_kv(int64_t rows, int64_t keys, const float* ds, const float* p, float* dk, float* dv) = 0;
};

std::unique_ptr<HeadProducts> float32_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                               int64_t tile_rows);
// Null where the build or the CPU lacks AVX512-BF16.
std::unique_ptr<HeadProducts> bf16_dot_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                                int64_t tile_rows);

}  // namespace titan::model::kernels
