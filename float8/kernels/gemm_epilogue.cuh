// float8/kernels/gemm_epilogue.cuh — the outer-product rescale after a rowwise float8 GEMM run
// with unit scales (CUDA build only; raw-pointer API, no LibTorch headers).
//
// A rowwise GEMM without fast accumulation runs cuBLAS's tensorwise kernel with unit scales into
// float32 and applies outer(1/sA, 1/sB) afterwards (gemm.cpp). As three ATen ops that is two
// broadcast float32 multiplies and a conversion: 22 bytes of traffic per output element. This
// kernel reads the float32 product once and writes the output dtype once (6 bytes for bf16),
// with the composite's arithmetic: (x * row_scale[r]) rounded to float32, times col_scale[c]
// rounded to float32, then one round-to-nearest-even conversion (ATen's own on CUDA).
#pragma once

#include <cstdint>

namespace titan::float8::kernels {

enum class EpilogueOut { Float32, BFloat16 };

// out[r, c] = dtype(float(x[r, c] * row_scale[r]) * col_scale[c]); x and out row-major
// [rows, cols] (out may alias x when the output is float32).
void launch_outer_scale(const float* x, int64_t rows, int64_t cols, const float* row_scale,
                        const float* col_scale, EpilogueOut dst, void* out, void* stream);

}  // namespace titan::float8::kernels
