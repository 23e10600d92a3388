// model/kernels/fused_ops_cuda.h — the CUDA twins of the fused CPU kernels (fused_ops.h), on
// float32 or bfloat16 at::Tensors. They exist in every build and throw std::runtime_error without TITAN_CUDA.
//
// Note [Fused ops on CUDA]: the CUDA kernels (fused_ops_kernels.cu) run float32 and bfloat16
// activations (bf16 widened to float32, the float32 arithmetic, each output rounded once: the
// CPU bf16 kernels' contract). tests/test_fused_ops.cpp's [cuda] cases check them against the
// ATen composite (float32) and against the float32 kernels on the widened inputs, rounded (bf16,
// bit for bit); scripts/gpu_check.sh runs them. The model takes them by default;
// TITAN_FUSED_OPS_CUDA=0 sends CUDA back to the ATen composites (to compare, or to rule them out).
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::model {

// Not TITAN_FUSED_OPS_CUDA=0 in the environment (read once), in any build.
bool fused_ops_cuda_requested();
// A CUDA build and fused_ops_cuda_requested().
bool fused_ops_cuda_enabled();

namespace cuda_ops {
// All tensors contiguous on one CUDA device, the activations all float32 or all bfloat16, rstd and
// RoPE's tables float32; outputs preallocated (shapes as the CPU kernels).
void rms_norm_forward(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y, at::Tensor& rstd);
void rms_norm_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                       const at::Tensor& rstd, at::Tensor& gx, at::Tensor& gw);
void rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse, at::Tensor& y);
void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& y);
void swiglu_backward(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up,
                     at::Tensor& dgate, at::Tensor& dup);
}  // namespace cuda_ops
}  // namespace titan::model
