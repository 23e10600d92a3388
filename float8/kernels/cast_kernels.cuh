// float8/kernels/cast_kernels.cuh — launchers of the float8 cast kernels (CUDA build only).
//
// Raw-pointer API (TransformerEngine style) so cast_kernels.cu compiles with nvcc without the
// LibTorch headers; fused_cast.cpp wraps these for at::Tensor. Every kernel computes exactly
// the formulas of scaling.h (float64 scale division, explicit clamp, round-to-nearest-even
// saturating conversion), so results equal the CPU reference bit for bit.
#pragma once

#include <cstdint>

namespace titan::float8::kernels {

enum class SrcType { Float32, BFloat16, Float16 };
enum class Fp8Type { E4M3, E5M2 };

// Broadcastable float32 scale: scale(r, c) = scale[r * row_stride + c * col_stride]; strides
// are 0 along shared dimensions (tensorwise: both 0; per row: (1, 0); per column: (0, 1)).
struct ScaleRef {
  const float* ptr;
  int64_t row_stride;
  int64_t col_stride;
};

// amax_out[0] = max|x| over n elements. amax_out must be zeroed first (launcher does it).
void launch_tensorwise_amax(const void* x, SrcType src, int64_t n, float* amax_out,
                            void* stream);

// amax_out[c] = max_r |x[r, c]| for row-major x [rows, cols] (per-column amax).
void launch_colwise_amax(const void* x, SrcType src, int64_t rows, int64_t cols, float* amax_out,
                         void* stream);

// scale_out[i] = float(fp8_max / max(double(amax[i]), 1e-12)), optionally pow2-rounded.
void launch_scale_from_amax(const float* amax, int64_t count, double fp8_max, bool round_pow2,
                            float* scale_out, void* stream);

// out[r, c] = fp8(clamp(float(x[r, c]) * scale(r, c), -max, max)), x and out row-major.
void launch_cast(const void* x, SrcType src, int64_t rows, int64_t cols, ScaleRef scale,
                 Fp8Type dst, void* out, void* stream);

// Fused rowwise: one block per row computes amax, the scale (written to scale_out[r]) and
// the cast of that row in one pass over global memory for the reduction and one for the cast.
void launch_rowwise_amax_scale_cast(const void* x, SrcType src, int64_t rows, int64_t cols,
                                    double fp8_max, bool round_pow2, Fp8Type dst, void* out,
                                    float* scale_out, void* stream);

// Cast + transpose: out_t[c, r] = fp8(clamp(float(x[r, c]) * scale(r, c))), out_t row-major
// [cols, rows]: the column-major float8 operand layout the backward GEMMs need.
void launch_cast_transpose(const void* x, SrcType src, int64_t rows, int64_t cols,
                           ScaleRef scale, Fp8Type dst, void* out_t, void* stream);

}  // namespace titan::float8::kernels
