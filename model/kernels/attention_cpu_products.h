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
// attention.h), tiles of up to tile_rows queries. Every product runs over the tile's key range
// [key_begin, key_begin + keys) (kernels::tile_keys: the keys its rows may see), key_begin a
// multiple of key_alignment(); the tile's matrices s, p, dp, ds are [rows, keys] over that range.
// Every float32 matrix is row-major and dense (ld = its width).
class HeadProducts {
 public:
  virtual ~HeadProducts() = default;
  // The multiple of keys a range may start at: the width of the packed key panels.
  virtual int64_t key_alignment() const = 0;
  // One kv head's keys and values, rows `stride` elements apart: packed for every product.
  virtual void load_kv(const at::BFloat16* k, int64_t k_stride, const at::BFloat16* v, int64_t v_stride) = 0;
  // The tile's queries and (backward) their output gradients, rows `stride` apart.
  virtual void load_q(const at::BFloat16* q, int64_t stride, int64_t rows) = 0;
  virtual void load_dout(const at::BFloat16* dout, int64_t stride, int64_t rows) = 0;
  virtual void scores(int64_t rows, int64_t key_begin, int64_t keys, float* s) = 0;       // s = q k^T
  virtual void grad_probs(int64_t rows, int64_t key_begin, int64_t keys, float* dp) = 0;  // dp = dO v^T
  // o [rows, v_hd] = p v, dq [rows, qk_hd] = ds k
  virtual void out(int64_t rows, int64_t key_begin, int64_t keys, const float* p, float* o) = 0;
  virtual void grad_q(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, float* dq) = 0;
  // dk [kv_len, qk_hd] += ds^T q and dv [kv_len, v_hd] += p^T dO (the tile's queries and
  // gradients): the whole head's accumulators, rows key_begin .. key_begin + keys updated.
  virtual void grad_kv(int64_t rows, int64_t key_begin, int64_t keys, const float* ds, const float* p, float* dk,
                       float* dv) = 0;
};

std::unique_ptr<HeadProducts> float32_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                               int64_t tile_rows);
// Null where the build or the CPU lacks AVX512-BF16.
std::unique_ptr<HeadProducts> bf16_dot_products(int64_t kv_len, int64_t qk_head_dim, int64_t v_head_dim,
                                                int64_t tile_rows);

}  // namespace titan::model::kernels
