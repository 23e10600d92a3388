// model/kernels/attention.h — scaled dot-product attention on the CPU in bfloat16: forward with
// the log-sum-exp, backward from any (out, lse), grouped-query heads natively.
//
// Why: LibTorch's CPU flash-attention kernel in bfloat16 packs each block's operands for a bf16
// GEMM, which at the head sizes CPU runs use costs more than the arithmetic: on the debug model
// (head_dim 16, 128 tokens) its backward took 48% of a training step, 7.9 ms per layer against
// 2.0 ms for the same kernel in float32. This kernel converts each head's keys and values to
// float32 once and runs every product as float32 GEMMs over query tiles (Note [CPU attention
// by query tiles] in attention_cpu.cpp): 1.5 ms for that layer, forward and backward. It runs
// where it is the faster of the two (Note [Where the CPU attention kernel runs] below).
//
// Numerics: the softmax in float32 (exp to ~20 ulp, as LibTorch's flash kernel); the products
// in float32 FMAs (one rounding per output element) or, where the CPU has AVX512-BF16 and heads
// are at least kMinHeadDimForDots wide, bf16 dot products, which round P and dS to bf16 first
// as the flash kernel rounds P (Note [CPU attention products] in attention_cpu.cpp). Both are
// checked against the float64 softmax with bounds built from the terms
// (tests/test_attention_kernel.cpp). Float32 attention keeps LibTorch's kernel (a float32 run's
// losses stay bit for bit what they were); TITAN_FUSED_OPS=0 turns this kernel off with the
// other fused CPU ops.
//
// Note [Attention head sizes and scale]: every attention path of titan takes q and k of one head
// size (qk_head_dim) and v of another (v_head_dim; DeepSeek-V3's multi-head latent attention:
// 192 and 128), as torch's scaled_dot_product_attention does: out [B, H, Sq, v_head_dim], lse
// unchanged, dq / dk of q's and k's size, dv of v's. The softmax scale of q . k is the caller's
// `std::optional<double> scale`, unset meaning 1 / sqrt(qk_head_dim) (torch's `scale=None`; the
// attention module decides it: DeepSeek-V3 passes qk_head_dim^-0.5 times YaRN's mscale^2, as
// torchtitan's `inner_attention(q, k, v, scale=self.softmax_scale)`). An unset scale reaches
// LibTorch's kernels unset (they compute the same 1 / sqrt(q.size(-1)) in double); titan's own
// kernels resolve it with attention_softmax_scale.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace titan::model {

// ---- the kernels on raw buffers (model/kernels/attention_cpu.cpp)
namespace kernels {

struct AttentionDims {
  int64_t batch, heads, kv_heads, q_len, kv_len;
  int64_t qk_head_dim;  // of q and k
  int64_t v_head_dim;   // of v, out and dout (See Note [Attention head sizes and scale])
  bool causal;
  float scale;  // of q . k (attention_softmax_scale)
  // The band (See Note [Banded attention masks] in model/attention_blocks.h): query row i sits
  // key_offset positions after key row 0's position, and sees keys at most window - 1 behind it
  // (0: no window).
  int64_t window = 0;
  int64_t key_offset = 0;
};

// Keys [begin, end) of the head; empty when begin >= end.
struct KeyRange {
  int64_t begin, end;
};
// The keys query row i sees: hi = causal ? min(Sk, i + key_offset + 1) : Sk, lo = window ?
// max(0, i + key_offset - window + 1) : 0, both clamped to [0, Sk]. Both ends are non-decreasing
// in i, so a tile of consecutive rows sees [lo(first), hi(last)).
inline KeyRange visible_keys(const AttentionDims& d, int64_t i) {
  const auto clamp = [&](int64_t x) { return x < 0 ? int64_t{0} : x > d.kv_len ? d.kv_len : x; };
  return {d.window > 0 ? clamp(i + d.key_offset - d.window + 1) : 0,
          d.causal ? clamp(i + d.key_offset + 1) : d.kv_len};
}
// The keys a tile of `rows` rows from `first` multiplies over: [lo(first), hi(last)) with its
// start rounded down to a multiple of `alignment` (what the packed key panels need); the keys
// outside a row's own range get p = 0 and dS = 0 exactly. Empty when no row sees a key.
inline KeyRange tile_keys(const AttentionDims& d, int64_t first, int64_t rows, int64_t alignment) {
  const KeyRange lo = visible_keys(d, first), hi = visible_keys(d, first + rows - 1);
  if (hi.end <= lo.begin) return {0, 0};
  return {lo.begin / alignment * alignment, hi.end};
}
// Element strides of a [B, heads, S, hd] operand whose last dim is contiguous.
struct RowStrides {
  int64_t batch, head, row;
};

// How the products run (Note [CPU attention products] in attention_cpu.cpp): float32 FMAs on
// every x86 CPU with AVX2, or bf16 dot products where the CPU has AVX512-BF16 (asked for
// without it: float32).
enum class AttentionProducts { kFloat32, kBf16Dot };
bool cpu_has_bf16_dot_products();
// The heads from which bf16 dot products are the faster (below, packing P and dS costs more
// than the products save; measured in the Note).
constexpr int64_t kMinHeadDimForDots = 32;
// What the model runs: bf16 dot products where the CPU has them and both head sizes are at least
// kMinHeadDimForDots (P is packed for the v-wide products, dS for the qk-wide ones: each packing
// pays off only over a wide enough head).
AttentionProducts default_attention_products(int64_t qk_head_dim, int64_t v_head_dim);

// out [B, H, Sq, v_hd] and lse [B, H, Sq] contiguous.
using BF16 = at::BFloat16;
void attention_forward_cpu(const AttentionDims& d, const BF16* q, RowStrides qs, const BF16* k, RowStrides ks,
                           const BF16* v, RowStrides vs, BF16* out, float* lse, AttentionProducts products);
// lse [B, H, Sq], dq [B, H, Sq, qk_hd], dk [B, KV, Sk, qk_hd], dv [B, KV, Sk, v_hd] contiguous;
// G: bf16 or float.
template <typename G>
void attention_backward_cpu(const AttentionDims& d, const BF16* dout, RowStrides dos, const BF16* q, RowStrides qs,
                            const BF16* k, RowStrides ks, const BF16* v, RowStrides vs, const BF16* out,
                            RowStrides os, const float* lse, G* dq, G* dk, G* dv, AttentionProducts products);

}  // namespace kernels

// The softmax scale of q . k: `scale`, or 1 / sqrt(qk_head_dim) where unset (See Note [Attention
// head sizes and scale]).
double attention_softmax_scale(int64_t qk_head_dim, std::optional<double> scale);

// Note [Where the CPU attention kernel runs]: LibTorch's bf16 flash kernel pays a fixed cost
// per block of keys, then multiplies with bf16 dot products (MKL's). Short key ranges are all
// fixed cost, long ones all arithmetic. Measured (titan-bench-attention, 2-core AMD EPYC with
// AVX512-BF16, no AMX; forward + backward against flash bf16):
// - with bf16 dot products (head_dim >= kMinHeadDimForDots on such CPUs): 2.2x at 256 keys
//   (head_dim 64), 2.8x / 1.9x / 1.6x at 512 / 1024 / 2048 keys (head_dim 128), 1.9x / 1.02x
//   at 512 / 2048 keys (head_dim 32): titan's kernel at every length;
// - with float32 FMAs (smaller heads, or no AVX512-BF16): 5.3x at 128 keys (head_dim 16), 1.2x
//   / 1.06x at 1024 / 2048 keys (16), but 0.87-0.89x at 1024 keys for head_dim 64 / 128 (the
//   FMAs run at ~85% of the float32 peak there; flash's dot products at twice that rate): over
//   kCpuAttentionMaxKeys keys, LibTorch's kernel.
// Ring attention's blocks and a document's own attention count their own keys. Not measured: a
// CPU with AMX, where LibTorch's bf16 GEMMs run on tile units and the lines may sit lower.
constexpr int64_t kCpuAttentionMaxKeys = 512;

// Whether cpu_attention_forward / _backward should run for these operands (See Note [Where the
// CPU attention kernel runs]): CPU bfloat16, bf16 dot products for these head sizes or at most
// kCpuAttentionMaxKeys keys (v.size(2)), the AVX2 kernels present, the fused ops on. The kernel
// itself takes any length. The second form is the same rule without a tensor (the memory
// estimate's).
bool cpu_attention_kernel_applies(const at::Tensor& q, const at::Tensor& v);
bool cpu_attention_kernel_applies(at::ScalarType dtype, int64_t qk_head_dim, int64_t v_head_dim, int64_t kv_len);

// Whether titan's kernel can run at all for this dtype (bfloat16, the AVX2 kernels present, the
// fused ops on): what the block layer asks where LibTorch's kernel cannot take the mask (a
// window or a key offset), whatever the length.
bool cpu_attention_kernel_runs(at::ScalarType dtype);

// q [B, H, Sq, qk_hd]; k [B, KV, Sk, qk_hd], v [B, KV, Sk, v_hd], H a multiple of KV, any strides
// with the last dim contiguous. `causal`, `window`, `key_offset`: query i sees key j iff
// (!causal || j <= i + key_offset) && (window == 0 || i + key_offset - j < window) (See Note
// [Banded attention masks] in model/attention_blocks.h; 0, 0: the causal square or no mask); a
// tile of queries multiplies only over the keys its rows see (kernels::tile_keys). `scale`: of
// q . k (See Note [Attention head sizes and scale]). Returns out [B, H, Sq, v_hd] (q's dtype,
// contiguous) and lse [B, H, Sq] float32: log sum_j exp(scale q_i . k_j) over the visible keys,
// -inf (and out 0) for a row that sees none. `products`: how the kernel multiplies (unset:
// kernels::default_attention_products; tests and titan-bench-attention pass each).
std::tuple<at::Tensor, at::Tensor> cpu_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         bool causal, std::optional<double> scale = std::nullopt,
                                                         int64_t window = 0, int64_t key_offset = 0,
                                                         std::optional<kernels::AttentionProducts> products = {});

// The gradients given the rows' final `out` and `lse` (those of the whole attention, which may
// span more keys than k/v: ring attention's merged results; any (out, lse) at all: the backward
// only forms P = exp(scale q k^T - lse) and rowsum(dout * out) from them). dq [B, H, Sq, qk_hd],
// dk [B, KV, Sk, qk_hd], dv [B, KV, Sk, v_hd] (each group's query heads summed) in `grad_dtype`:
// q's dtype or float32. The mask as the forward's; masked pairs add exact zeros, a row that sees
// no key gets dq 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor> cpu_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, bool causal, at::ScalarType grad_dtype, std::optional<double> scale = std::nullopt,
    int64_t window = 0, int64_t key_offset = 0, std::optional<kernels::AttentionProducts> products = {});

}  // namespace titan::model
