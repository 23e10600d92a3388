// float8/kernels/block_cast.h — at::Tensor entry points of the block-scaled CUDA casts
// (block_cast_kernels.cu): quantize_blocks() (float8/block_scaled.h) in one launch, and the
// "dim1" casts that quantize x^T without materializing it (the transposed operands of the
// backward GEMMs, whose blocks must run along the new contraction dimension).
//
// They exist in every build; without TITAN_CUDA, fused_quantize_blocks_cuda throws
// std::runtime_error and block_cast_cuda_applies is false.
#pragma once

#include <ATen/core/Tensor.h>

#include "float8/block_scaled.h"

namespace titan::float8 {

// true when fused_quantize_blocks_cuda(x, layout, transposed) runs here: a CUDA build, a 2-D
// Float / BFloat16 CUDA tensor, e4m3 elements, and
//   MX (1 x 32, E8M0): the blocked dimension (columns; rows when transposed) a multiple of 32;
//   blockwise 1 x 128 or 128 x 128 (float32 scales), partial edge tiles allowed;
// within the kernels' grid limits (blocked along rows: at most 65535 * 32 columns for the
// transposed casts, 65535 * 128 rows for 128 x 128). E2M1 (MXFP4) never applies.
bool block_cast_cuda_applies(const at::Tensor& x, const BlockLayout& layout, bool transposed);

// transposed = false: quantize_blocks(x, layout), bit for bit (except that a NaN element is the
// e4m3 code 0x7F, never its negative twin 0xFF). transposed = true: quantize_blocks(
// x.t().contiguous(), layout), without the copy: data [C, R], rows = C, cols = R. Throws
// std::invalid_argument naming the reason where block_cast_cuda_applies is false (E2M1:
// "... has no CUDA cast"), std::runtime_error without CUDA.
BlockScaledTensor fused_quantize_blocks_cuda(const at::Tensor& x, const BlockLayout& layout,
                                             bool transposed);

}  // namespace titan::float8
