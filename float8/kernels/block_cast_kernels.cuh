// float8/kernels/block_cast_kernels.cuh — launchers of the block-scaled cast kernels (MXFP8 and
// blockwise float8; CUDA build only).
//
// Raw-pointer API like cast_kernels.cuh, so block_cast_kernels.cu compiles with nvcc without the
// LibTorch headers; block_cast.cpp wraps these for at::Tensor. Each kernel computes one block's
// amax, its scale and the e4m3 cast of its elements in one pass, with the formulas of
// float8/block_scaled.h op for op (same roundings, same order), so the results equal
// quantize_blocks() on the CPU bit for bit. All tensors are row-major and on the device.
#pragma once

#include <cstdint>

#include "float8/kernels/cast_kernels.cuh"  // SrcType

namespace titan::float8::kernels {

// How a block's scale is derived from its amax and applied (block_scaled.h's file comment):
//   MxFloor, MxRceil: E8M0 exponent per 32 elements (uint8 scale), torchao's to_mx FLOOR / RCEIL
//   Blockwise:        float32 multiplier per 1 x 128 or 128 x 128 tile (the dequantization
//                     multiplier 1 / s is stored)
enum class BlockScaleMode { MxFloor, MxRceil, Blockwise };

// Blocks along the last dimension ("dim0" cast) of x [rows, cols]: 32 elements (MX modes; cols
// must be a multiple of 32) or 128 (Blockwise; the last tile of a row may be partial).
//   data_out  [rows, cols] e4m3 bytes
//   scale_out MX: uint8 [rows, cols / 32]; Blockwise: float32 [rows, ceil(cols / 128)]
void launch_block_cast_dim0(const void* x, SrcType src, int64_t rows, int64_t cols,
                            BlockScaleMode mode, void* data_out, void* scale_out, void* stream);

// The dim0 cast of x^T without materializing x^T ("dim1" cast): blocks of 32 (MX; rows must be
// a multiple of 32) or 128 (Blockwise; the last tile may be partial) consecutive ROWS of x.
//   data_out  [cols, rows] e4m3 bytes (row-major: x^T's quantization)
//   scale_out MX: uint8 [cols, rows / 32]; Blockwise: float32 [cols, ceil(rows / 128)]
// cols must be at most 65535 * 32 (one grid row per 32 columns).
void launch_block_cast_dim1(const void* x, SrcType src, int64_t rows, int64_t cols,
                            BlockScaleMode mode, void* data_out, void* scale_out, void* stream);

// Blockwise 128 x 128 tiles of x [rows, cols] (edge tiles partial). transposed = false:
// data_out [rows, cols], scale_out float32 [ceil(rows / 128), ceil(cols / 128)]; transposed =
// true: the 128 x 128 quantization of x^T, data_out [cols, rows], scale_out [ceil(cols / 128),
// ceil(rows / 128)] (x^T's tiles are x's tiles transposed: same amax, same scale).
// rows must be at most 65535 * 128.
void launch_blockwise_tile_cast(const void* x, SrcType src, int64_t rows, int64_t cols,
                                bool transposed, void* data_out, float* scale_out, void* stream);

}  // namespace titan::float8::kernels
