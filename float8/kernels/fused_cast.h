// float8/kernels/fused_cast.h — at::Tensor entry points of the CUDA cast kernels, each next to
// its CPU reference (the scaling.h functions the kernels must reproduce bit for bit).
//
// The fused kernels replace what torch.compile fuses for torchao: amax + scale + cast in
// one launch per row (rowwise) or two launches (tensorwise: a global reduction must finish
// before any element can be scaled), and cast + transpose for the column-major operands of the
// backward GEMMs. The CUDA entry points exist in every build and throw std::runtime_error when
// titan_float8 was built without TITAN_CUDA.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "float8/recipe.h"
#include "float8/scaling.h"

namespace titan::float8 {

// Note [Fused casts on the hot path]: to_float8() on a CUDA tensor asks this first. It covers
// per-row and tensorwise casts of any rank (axis_dim = last: flattened to 2-D and back, the scale
// following the data) and, for 2-D x, axis_dim = 0: per-column casts, and tensorwise casts asked
// for the backward's column-major operands (the cast + transpose kernel, returned as its
// transposed view, i.e. column-major data, the layout _scaled_mm wants for its second operand:
// no float8 transpose copy before the GEMM; a tensorwise cast's values do not depend on the axis,
// only this layout does). The first call per (source dtype, float8 dtype, granularity, rows or
// columns) is compared bit for bit with to_float8_composite(); a mismatch turns the fused path
// off for that case with a warning, so a kernel bug costs speed, never numerics. nullopt: not
// applicable (no CUDA build, other dtypes or axes, TITAN_FLOAT8_FUSED_CASTS=0); the caller then
// runs the composite.
std::optional<Float8Tensor> try_fused_to_float8(const at::Tensor& x, const CastConfig& config,
                                                int64_t axis_dim, bool round_scales_to_power_of_2);

// false when TITAN_FLOAT8_FUSED_CASTS=0: every cast (CUDA and CPU) takes the composite.
bool fused_casts_enabled();

// to_float8(x, config, axis_dim = -1) for a 2-D CUDA x [R, C] (float, bf16 or half):
// tensorwise (scale ()) or per row (scale (R, 1)).
Float8Tensor fused_cast_rows_cuda(const at::Tensor& x, const CastConfig& config,
                                  bool round_scales_to_power_of_2);
// CPU reference of fused_cast_rows_cuda.
Float8Tensor fused_cast_rows_reference(const at::Tensor& x, const CastConfig& config,
                                       bool round_scales_to_power_of_2);

// transpose_2d(to_float8(x, config, axis_dim = 0)) with CONTIGUOUS data for a 2-D CUDA x
// [R, C]: data [C, R] row-major (= x's float8 copy in column-major), scale () or (C, 1).
// This is G^T for grad_weight and the column-major B operand x^T of the same GEMM.
Float8Tensor fused_cast_transpose_cols_cuda(const at::Tensor& x, const CastConfig& config,
                                            bool round_scales_to_power_of_2);
// CPU reference of fused_cast_transpose_cols_cuda.
Float8Tensor fused_cast_transpose_cols_reference(const at::Tensor& x, const CastConfig& config,
                                                 bool round_scales_to_power_of_2);

// to_float8_with_scale(x, scale (0-dim), dtype) for a 2-D x [R, C], the data column-major on CUDA
// (the cast + transpose kernel, as above) and as to_float8_with_scale lays it out elsewhere: a
// tensorwise G cast once per row serves grad_input, this copy of it grad_weight (G^T as the
// row-major first operand) without a float8 transpose copy. Values bit for bit the same.
Float8Tensor cast_to_columns_with_scale(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);
// to_float8_with_scale(x, scale (0-dim), dtype) for x of any rank, in one pass on CUDA (the
// tensorwise cast kernel, 16 bytes per thread) instead of the composite's float32 temporaries:
// the delayed recipe's casts, whose scale comes from the amax history. Values and layout bit for
// bit to_float8_with_scale's, which runs elsewhere.
Float8Tensor cast_rows_with_scale(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);

// ---- CPU: the same casts as single vectorized passes (fused_cast_cpu.cpp) ----
// Note [Fused CPU casts]: to_float8() on a float32 / bf16 CPU tensor takes
// try_fused_to_float8_cpu: amax (through the op layer as "amax", like amax()), scale_from_amax,
// then one cast pass, for tensorwise, per-row (last dim, any rank) and per-column (dim 0 of 2-D)
// scales; equal bit for bit to to_float8_composite (tests/test_float8.cpp). nullopt: not
// applicable (other dtypes or axes); the caller runs the composite.
std::optional<Float8Tensor> try_fused_to_float8_cpu(const at::Tensor& x, const CastConfig& config,
                                                    int64_t axis_dim, bool round_scales_to_power_of_2);
// amax(x, granularity, axis) for float32 / bf16 CPU x; axis (wrapped) the last dim or 0 of 2-D.
at::Tensor fused_amax_cpu(const at::Tensor& x, ScalingGranularity granularity, int64_t axis);
// cast_to_float8(x, scale, dtype) for float32 / bf16 CPU x; scale 0-dim, per row or (1, C).
at::Tensor fused_cast_cpu(const at::Tensor& x, const at::Tensor& scale, at::ScalarType dtype);
// float_to_e2m1_codes (float8/block_scaled.h) for contiguous float32 CPU x: torchao's integer
// steps eight lanes at a time, bit for bit the tensor form (tests/test_block_scaled.cpp).
at::Tensor e2m1_codes_cpu(const at::Tensor& x);
// data.to(float32) / scale in one pass: 2-D float8 CPU data (either memory order; the result
// keeps it), scale 0-dim or broadcastable (Note [Scale follows data]).
at::Tensor dequantize_to_float_cpu(const at::Tensor& data, const at::Tensor& scale);

}  // namespace titan::float8
