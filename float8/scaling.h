// float8/scaling.h — amax, scale and cast: the float8 recipes as plain functions.
//
// TransformerEngine style: a quantized tensor is (data, scale, amax-derived) plain tensors, and
// each step of a recipe is a free function over them. The formulas are torchao.float8's exactly
// (docs/float8.md "Recipes"), so CPU results match torchao's bit for bit:
//   amax  = max|x|                      (tensorwise: 0-dim; axiswise: keepdim along `dim`)
//   scale = float32(fp8_max / max(float64(amax), kEps)), optionally exp2(floor(log2(scale)))
//   data  = to_fp8(clamp(float32(x) * scale, -fp8_max, fp8_max))   (round to nearest even)
//   x    ~= data.to(orig_dtype) / scale
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <functional>

#include "float8/recipe.h"

namespace titan::float8 {

// Lower bound on amax: an all-zero tensor (or row) still gets a finite scale.
constexpr double kEps = 1e-12;

// Largest finite value: 448 (e4m3fn), 57344 (e5m2). Throws std::invalid_argument otherwise.
double float8_max(at::ScalarType float8_dtype);

// Note [Scale follows data]:
// `scale` is either 0-dim (tensorwise) or has data's rank with size 1 along every dimension
// that shares one scale (keepdim). A (B, S, K) activation scaled per row therefore has a
// (B, S, 1) scale, and its 2-D view (B*S, K) a (B*S, 1) scale. Data and scale are only ever
// reshaped together through reshape()/reshape_to_2d()/transpose_2d() below, which makes the
// failure of 3-D data next to a flattened 2-D scale unrepresentable; check_float8_tensor()
// enforces the invariant at every GEMM entry.
struct Float8Tensor {
  at::Tensor data;           // float8, any rank
  at::Tensor scale;          // float32, 0-dim or data's rank (See Note [Scale follows data])
  at::ScalarType orig_dtype = at::kFloat;  // dtype dequantize() returns

  bool is_tensorwise() const { return scale.dim() == 0; }
};

// max|x| as float32: 0-dim for Tensorwise; for Axiswise reduced over `dim` with keepdim.
at::Tensor amax(const at::Tensor& x, ScalingGranularity granularity, int64_t dim);

// fp8_max / max(amax, kEps) computed in float64, returned as float32 (amax's shape).
at::Tensor scale_from_amax(const at::Tensor& amax, at::ScalarType float8_dtype,
                           bool round_to_power_of_2);

// exp2(floor(log2(scale))) in float32. Exact powers of two are kept; the largest finite float
// becomes inf because float32 log2 rounds up to 128 (torchao does the same).
at::Tensor round_scale_to_power_of_2(const at::Tensor& scale);

// float8 data = saturating cast of float32(x) * scale. The explicit clamp is required: c10's
// Float8 conversion before PyTorch 2.12 turns |v| >= 480 into NaN instead of saturating.
at::Tensor cast_to_float8(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);

// Dynamic scaling: amax -> scale -> cast. `axis_dim` is the dimension reduced for Axiswise
// (the GEMM's contraction dimension) and ignored for Tensorwise. On CUDA the fused kernels run
// where they apply (Note [Fused casts on the hot path], float8/kernels/fused_cast.h).
Float8Tensor to_float8(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                       bool round_scales_to_power_of_2 = false);
// The same with ATen ops only, on any device: the numerics the fused kernels reproduce.
Float8Tensor to_float8_composite(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                                 bool round_scales_to_power_of_2 = false);

// to_float8 of one shard of a tensor split over ranks: the amax is first reduced by `amax_max`
// (an all_reduce(MAX) over the ranks holding the other shards), so the scale is the one a single
// process computes from the whole tensor. Never the fused CUDA path (it has no reduction hook).
Float8Tensor to_float8_with_global_amax(const at::Tensor& x, const CastConfig& config, int64_t axis_dim,
                                        bool round_scales_to_power_of_2,
                                        const std::function<void(at::Tensor&)>& amax_max);

// Cast with a given scale (delayed scaling, or a precomputed FSDP scale).
Float8Tensor to_float8_with_scale(const at::Tensor& x, const at::Tensor& scale,
                                  at::ScalarType float8_dtype);

// data.to(orig_dtype) / scale, in orig_dtype.
at::Tensor dequantize(const Float8Tensor& t);

// Throws std::invalid_argument when t breaks Note [Scale follows data] or is not float8.
void check_float8_tensor(const Float8Tensor& t, const char* what);

// Reshape data and scale together. The last dimension must be kept; the scale's leading
// dimensions must all be full (per-row scales) or all 1 (per-column / tensorwise).
Float8Tensor reshape(const Float8Tensor& t, at::IntArrayRef shape);

// (..., K) -> (-1, K) for the GEMM, scale following.
Float8Tensor reshape_to_2d(const Float8Tensor& t);

// 2-D transpose of data and scale together: (M, K) with scale (M, 1) -> (K, M) with (1, M).
Float8Tensor transpose_2d(const Float8Tensor& t);

}  // namespace titan::float8
