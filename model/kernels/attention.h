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
// Numerics: every product and the softmax in float32 (exp to ~20 ulp, as LibTorch's flash
// kernel), one rounding per output element; P is not rounded to bf16 before P V as in the
// flash kernel. So the output is the float64 reference's, rounded, within a few float32 ulps
// (tests/test_attention_kernel.cpp). Float32 attention keeps LibTorch's kernel (a float32 run's
// losses stay bit for bit what they were); TITAN_FUSED_OPS=0 turns this kernel off with the
// other fused CPU ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <tuple>

namespace titan::model {

// Note [Where the CPU attention kernel runs]: its GEMMs are float32 FMAs, which run near the
// float32 peak (~85% at 2k keys); LibTorch's bf16 flash kernel pays a fixed cost per block of
// keys but then multiplies with bf16 dot-product instructions (2x float32's rate where the CPU
// has them). Short key ranges are all fixed cost and titan's kernel wins; long ones are all
// arithmetic and flash's does. Measured (titan-bench-attention, 2-core AMD EPYC with
// AVX512-BF16, forward + backward against flash bf16): 128 keys 3.2x (head_dim 16), 256 keys
// 1.7x (64), 512 keys 1.3x (128); 1024 keys 0.87-0.89x at head_dim 64 / 128 (1.2x at 16); 2048
// keys 0.76x (128). So attention over more than kCpuAttentionMaxKeys keys keeps LibTorch's
// kernel. Ring attention's blocks and a document's own attention count their own keys. Not
// measured: a CPU with AMX, where LibTorch's bf16 GEMMs run on tile units and the line may sit
// lower (scripts' and titan-bench-attention's tables say which CPU gave each figure).
constexpr int64_t kCpuAttentionMaxKeys = 512;

// Whether cpu_attention_forward / _backward should run for these operands (See Note [Where the
// CPU attention kernel runs]): CPU bfloat16, at most kCpuAttentionMaxKeys keys, the AVX2 kernels
// present, the fused ops on. The kernel itself takes any length.
bool cpu_attention_kernel_applies(const at::Tensor& q, int64_t kv_len);

// q [B, H, Sq, hd]; k, v [B, KV, Sk, hd], H a multiple of KV, any strides with the last dim
// contiguous. `causal`: query i sees keys 0..i (Sq == Sk). Returns out [B, H, Sq, hd] (q's
// dtype, contiguous) and lse [B, H, Sq] float32: log sum_j exp(q_i . k_j / sqrt(hd)).
std::tuple<at::Tensor, at::Tensor> cpu_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                         bool causal);

// The gradients given the rows' final `out` and `lse` (those of the whole attention, which may
// span more keys than k/v: ring attention's merged results). dq [B, H, Sq, hd], dk, dv
// [B, KV, Sk, hd] (each group's query heads summed) in `grad_dtype`: q's dtype or float32.
std::tuple<at::Tensor, at::Tensor, at::Tensor> cpu_attention_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                      const at::Tensor& k, const at::Tensor& v,
                                                                      const at::Tensor& out, const at::Tensor& lse,
                                                                      bool causal, at::ScalarType grad_dtype);

// ---- the kernels on raw buffers (model/kernels/attention_cpu.cpp)
namespace kernels {

struct AttentionDims {
  int64_t batch, heads, kv_heads, q_len, kv_len, head_dim;
  bool causal;
  float scale;  // of q . k: 1 / sqrt(head_dim)
};
// Element strides of a [B, heads, S, hd] operand whose last dim is contiguous.
struct RowStrides {
  int64_t batch, head, row;
};

// out [B, H, Sq, hd] and lse [B, H, Sq] contiguous.
template <typename T>
void attention_forward_cpu(const AttentionDims& d, const T* q, RowStrides qs, const T* k, RowStrides ks, const T* v,
                           RowStrides vs, T* out, float* lse);
// lse [B, H, Sq], dq [B, H, Sq, hd], dk / dv [B, KV, Sk, hd] contiguous; G: T or float.
template <typename T, typename G>
void attention_backward_cpu(const AttentionDims& d, const T* dout, RowStrides dos, const T* q, RowStrides qs,
                            const T* k, RowStrides ks, const T* v, RowStrides vs, const T* out, RowStrides os,
                            const float* lse, G* dq, G* dk, G* dv);

}  // namespace kernels
}  // namespace titan::model
