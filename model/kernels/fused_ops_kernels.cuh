// model/kernels/fused_ops_kernels.cuh — launchers of the fused RMSNorm / RoPE / SwiGLU CUDA
// kernels (CUDA build only). Raw float32 pointers, so the .cu compiles without LibTorch headers;
// fused_ops_cuda.cpp wraps them for at::Tensor. Same formulas as the CPU kernels
// (model/kernels/fused_ops.h).
#pragma once

#include <cstdint>

namespace titan::model::kernels {

void launch_rms_norm_forward(const float* x, const float* w, int64_t rows, int64_t dim, float eps,
                             float* y, float* rstd, void* stream);
// gw_partial: [ceil(rows / 32), dim] scratch of per-block sums, reduced into gw in block order
// (deterministic, as the CPU kernel).
void launch_rms_norm_backward(const float* g, const float* x, const float* w, const float* rstd,
                              int64_t rows, int64_t dim, float* gx, float* gw_partial, float* gw,
                              void* stream);
void launch_rotary(const float* x, const float* cos, const float* sin, int64_t outer, int64_t seq,
                   int64_t inner, int64_t half, bool inverse, float* y, void* stream);
void launch_swiglu_forward(const float* gate, const float* up, int64_t n, float* y, void* stream);
void launch_swiglu_backward(const float* dy, const float* gate, const float* up, int64_t n,
                            float* dgate, float* dup, void* stream);

constexpr int64_t kRmsNormGradWeightBlockRows = 32;

}  // namespace titan::model::kernels
