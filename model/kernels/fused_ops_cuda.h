// model/kernels/fused_ops_cuda.h — the CUDA twins of the fused CPU kernels (fused_ops.h), on
// float32 at::Tensors. They exist in every build and throw std::runtime_error without TITAN_CUDA.
//
// Note [Fused ops on CUDA]: the CUDA kernels (fused_ops_kernels.cu) are compiled in the CUDA
// build and tested against the ATen composite by tests/test_fused_ops.cpp's [cuda] cases, but the
// model takes them only when TITAN_FUSED_OPS_CUDA=1: they have not yet been run on a GPU
// (scripts/gpu_check.sh runs the [cuda] cases), and on GPUs the model's activations are mostly
// bf16, which the fused path leaves to the composite. Until then CUDA runs the composite.
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::model {

// TITAN_FUSED_OPS_CUDA=1 in the environment (read once) and a CUDA build.
bool fused_ops_cuda_enabled();

namespace cuda_ops {
// All tensors contiguous float32 on one CUDA device; outputs preallocated (shapes as the CPU kernels).
void rms_norm_forward(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& y, at::Tensor& rstd);
void rms_norm_backward(const at::Tensor& g, const at::Tensor& x, const at::Tensor& w,
                       const at::Tensor& rstd, at::Tensor& gx, at::Tensor& gw);
void rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse, at::Tensor& y);
void swiglu_forward(const at::Tensor& gate, const at::Tensor& up, at::Tensor& y);
void swiglu_backward(const at::Tensor& dy, const at::Tensor& gate, const at::Tensor& up,
                     at::Tensor& dgate, at::Tensor& dup);
}  // namespace cuda_ops
}  // namespace titan::model
