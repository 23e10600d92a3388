// float8/block_scaled_cublaslt.h — block-scaled float8 GEMMs through cuBLASLt (CUDA build only):
// MXFP8 (VEC32_UE8M0 scales, Blackwell) and blockwise float8 (VEC128_32F / BLK128x128_32F
// scales, Hopper, cuBLAS >= 12.9). block_scaled_mm(..., BlockGemmBackend::CublasLt) calls it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "float8/block_scaled.h"

namespace titan::float8 {

// out[M, N] (out_dtype: Float, BFloat16 or Half) = dequantize(a)[M, K] @ dequantize(b)[N, K]^T,
// both operands' blocks along K, data and scales on the same CUDA device.
//   MXFP8:     both mx_layout(E4M3, any rounding); needs sm100+ and cuBLASLt >= 12.8.
//   blockwise: a 1 x 128 and b 128 x 128 (forward, grad_input), both 1 x 128 (grad_weight), or
//              a 128 x 128 and b 1 x 128; needs sm90+ and cuBLAS >= 12.9 (build and run time).
// K and N must be multiples of 16 (cuBLASLt's float8 alignment rule). MXFP4 operands throw
// std::invalid_argument (no cuBLASLt path; block_scaled_mm emulates them), as do mismatched or
// malformed operands; a missing capability throws std::runtime_error naming it.
at::Tensor cublaslt_block_scaled_mm(const BlockScaledTensor& a, const BlockScaledTensor& b,
                                    at::ScalarType out_dtype);

}  // namespace titan::float8
