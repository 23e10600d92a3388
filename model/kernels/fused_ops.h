// model/kernels/fused_ops.h — the block's pointwise ops as fused kernels: RMSNorm, RoPE and
// SwiGLU, forward and backward, each one pass over memory.
//
// Why: on the CPU the composite ATen forms of these ops were a large share of a step that is not
// GEMM: RMSNorm's float32 path is several kernels (pow, mean, rsqrt, two muls) and its autograd
// saves their intermediates; RoPE (unflatten, two selects, four muls, a stack) makes six
// [B, S, H, hd/2] temporaries; silu(gate) * up saves silu(gate) next to gate and up. The fused
// forms read their inputs once, write their outputs once, and save only what the backward
// needs (RMSNorm: x and one float32 rstd per row; RoPE: nothing but the table; SwiGLU: gate and
// up, recomputing the sigmoid).
//
// Each op is an autograd Function that needs no history of its own, so activation checkpointing
// (full or per op) recomputes it like any other non-kept op; none is on the per-op save list.
// The fused kernels run for float32 and bfloat16 CPU tensors (bf16: float32 math, one rounding
// per output); other dtypes run the ATen composite, and so does CUDA unless opted in, float32
// only (see Note [Fused ops on CUDA]). TITAN_FUSED_OPS=0 turns
// the fused path off everywhere (paired benchmarks, bisecting a numerics question).
//
// Numerics against the composite (tests/test_fused_ops.cpp): RoPE is the same float32 products
// and sums, so bit-identical forward; RMSNorm's sum of squares is reduced in another order
// (float32 reduction-order error, relative <= D * 2^-24); SwiGLU's sigmoid comes from another
// exp (a few ulps).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

namespace titan::model {

// rms_norm(x) * weight over the last dim; x [..., D], weight [D]. Same contract as
// at::rms_norm(x, {D}, weight, eps) for float32 x.
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotates the pairs (x[..., 2i], x[..., 2i+1]) of x [B, S, H, hd] by the angles of position s:
// cos/sin [>= S, hd/2] float32 (the RotaryTable). Same result as apply_rotary's composite.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, same shapes.
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

// Whether the fused path is on (TITAN_FUSED_OPS, read once; default on).
bool fused_ops_enabled();

// Note [What the fused ops keep]: for its backward the fused RMSNorm keeps x, the weight and
// rstd (one float32 a row); ATen's composite also keeps x * rstd and, in bf16, a float32 copy
// of x. The fused SwiGLU keeps gate and up and recomputes silu(gate); the composite also keeps
// silu(gate). The memory estimate (trainer/observe/memory_estimate.cpp) counts by which runs.
// Whether the fused kernels run for float32 / bf16 activations on CUDA (`cuda`) or the CPU:
// TITAN_FUSED_OPS, then on CUDA TITAN_FUSED_OPS_CUDA (asked in any build, since a CPU-only build
// plans CUDA runs), on the CPU the AVX2 kernels.
bool fused_ops_run_on(bool cuda);


// The sum of the squares of a bfloat16 tensor's elements, without a float32 copy of it (the
// gradient norm of bf16 gradients): float32 sums over fixed blocks of 4096 elements, added in
// float64 in block order, so the result does not depend on the thread count. Any contiguous CPU
// bf16 tensor (falls back to a float32 copy without the AVX2 kernels).
double sum_of_squares(const at::Tensor& x);

// ---- the kernels themselves, raw row-major buffers (tests call these directly) ----
// Each in float32 and in bfloat16: the bf16 form converts every row (span) to float32, runs
// the float32 code on it and rounds the result to nearest even, so it equals the float32 kernel
// on the upcast inputs, rounded; rstd and every accumulation stay float32.
namespace kernels {

#define TITAN_FUSED_KERNEL_DECLS(T)                                                                              \
  /* y[r, :] = x[r, :] * rstd[r] * w;  rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps). */                            \
  void rms_norm_forward_cpu(const T* x, const T* w, int64_t rows, int64_t dim, float eps, T* y, float* rstd);   \
  /* gx = rstd * (g*w - xhat * mean(g*w*xhat)), gw = sum_r g * xhat (xhat = x * rstd). */                        \
  void rms_norm_backward_cpu(const T* g, const T* x, const T* w, const float* rstd, int64_t rows, int64_t dim,  \
                             T* gx, T* gw);                                                                    \
  /* x [outer = B, seq, inner = H, 2 * half]; angle table rows [seq, half]. inverse: rotate by -angle (the      \
     backward: the transpose of a rotation is its inverse). */                                                  \
  void rotary_cpu(const T* x, const float* cos, const float* sin, int64_t outer, int64_t seq, int64_t inner,    \
                  int64_t half, bool inverse, T* y);                                                           \
  void swiglu_forward_cpu(const T* gate, const T* up, int64_t n, T* y);                                        \
  void swiglu_backward_cpu(const T* dy, const T* gate, const T* up, int64_t n, T* dgate, T* dup);
double sum_of_squares_cpu(const at::BFloat16* x, int64_t n);
TITAN_FUSED_KERNEL_DECLS(float)
TITAN_FUSED_KERNEL_DECLS(at::BFloat16)
#undef TITAN_FUSED_KERNEL_DECLS

}  // namespace kernels
}  // namespace titan::model
