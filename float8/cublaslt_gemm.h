// float8/cublaslt_gemm.h — tensorwise float8 GEMM through cuBLASLt directly (CUDA build only).
//
// The path beyond at::_scaled_mm (docs/float8.md "GEMM back ends"): device-side scale pointers, so
// delayed or precomputed scales never round-trip through the host.
#pragma once

#include <ATen/core/Tensor.h>

namespace titan::float8 {

// out[M, N] (out_dtype: Float, BFloat16 or Half) = inv_scale_a * inv_scale_b * (a @ b)
//   a: [M, K] float8 row-major;  b: [K, N] float8 column-major (b.t() contiguous)
//   inv_scale_a, inv_scale_b: 1-element float32 CUDA tensors (the GEMM's dequant multipliers)
// K and N must be multiples of 16 (cuBLASLt FP8 leading-dimension rule; scaled_mm pads).
at::Tensor cublaslt_scaled_mm_tensorwise(const at::Tensor& a, const at::Tensor& b,
                                         const at::Tensor& inv_scale_a,
                                         const at::Tensor& inv_scale_b, at::ScalarType out_dtype,
                                         bool use_fast_accum);

}  // namespace titan::float8
