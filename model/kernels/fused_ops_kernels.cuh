// model/kernels/fused_ops_kernels.cuh — launchers of the fused RMSNorm / RoPE / SwiGLU CUDA
// kernels (CUDA build only). Raw pointers, so the .cu compiles without LibTorch headers;
// fused_ops_cuda.cpp wraps them for at::Tensor. Same formulas as the CPU kernels
// (model/kernels/fused_ops.h). The activations (x, w, g, y, gate, up, ...) are `Elem`: float32,
// or bfloat16 read into float32, the float32 arithmetic run on them, and each output rounded
// once to nearest even, as the CPU's bf16 kernels; rstd, RoPE's tables and the weight-gradient
// partial sums are float32 whatever Elem is.
#pragma once

#include <cstdint>

namespace titan::model::kernels {

enum class Elem { kFloat32, kBFloat16 };

void launch_rms_norm_forward(Elem elem, const void* x, const void* w, int64_t rows, int64_t dim, float eps, void* y,
                             float* rstd, void* stream);
// gw_partial: [ceil(rows / 32), dim] float32 scratch of per-block sums, reduced into gw in block
// order (deterministic, as the CPU kernel).
void launch_rms_norm_backward(Elem elem, const void* g, const void* x, const void* w, const float* rstd,
                              int64_t rows, int64_t dim, void* gx, float* gw_partial, void* gw, void* stream);
void launch_rotary(Elem elem, const void* x, const float* cos, const float* sin, int64_t outer, int64_t seq,
                   int64_t inner, int64_t half, bool inverse, void* y, void* stream);
void launch_swiglu_forward(Elem elem, const void* gate, const void* up, int64_t n, void* y, void* stream);
void launch_swiglu_backward(Elem elem, const void* dy, const void* gate, const void* up, int64_t n, void* dgate,
                            void* dup, void* stream);

constexpr int64_t kRmsNormGradWeightBlockRows = 32;

}  // namespace titan::model::kernels
