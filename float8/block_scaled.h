// float8/block_scaled.h — block-scaled low precision: MX (MXFP8, MXFP4) and blockwise float8.
//
// Where float8's scales are one per tensor or per row, these formats carry one scale per BLOCK
// of consecutive elements along the GEMM's contraction dimension, so one outlier spoils 32 (MX)
// or 128 (blockwise) values instead of a whole row (docs/low_precision.md):
//   MXFP8   elements float8 e4m3, one E8M0 scale (a biased power-of-two exponent, 1 byte)
//           per 1 x 32 block. The OCP Microscaling format; Blackwell tensor cores multiply it.
//   MXFP4   elements fp4 e2m1 (two per byte, the first in the low nibble), the same E8M0 blocks.
//   blockwise float8 (DeepSeek-V3): elements e4m3, one float32 scale per 1 x 128 tile of an
//           activation or gradient and per 128 x 128 tile of a weight.
// A quantized operand is plain data (data, scale, layout); the functions below are the recipe.
// Every operand is 2-D with blocks along its LAST dimension (the contraction dimension of the
// GEMM it feeds): a GEMM is always out[M, N] = A[M, K] @ B[N, K]^T with both operands' blocks
// along K, and the transposed operands of the backward GEMMs are quantized from transposed
// copies ("dim1" casts) so that their blocks run along the new contraction dimension too.
//
// The formulas are torchao's (prototype.mx_formats to_mx / to_dtype, and the blockwise training
// kernels) op for op, so the CPU results equal torchao's emulation bit for bit:
//   MX, FLOOR:  e = clamp(exponent_bits(amax) - 127 - emax_elem, -127, 128) + 127 (uint8; 255
//               when amax is NaN); s = float32(e << 23) clamped below at 2^-126;
//               data = cast(clamp(x / s, -max, max))   (fp4: no clamp; the fp4 cast saturates)
//   MX, RCEIL:  d = amax / max_elem; e = clamp(ceil(log2(d)), -127, 127) + 127 (255 NaN, 254
//               inf); data = cast(clamp(x * r, -max, max)), r = 2^(127 - e) (1 when e = 0)
//   MX dequantize: data * 2^(e - 127) in the original dtype (NaN for e = 255)
//   blockwise:  amax' = max(amax, 1e-12) in float64; s = float32(448 / amax');
//               data = e4m3(clamp(x * s, -448, 448)); the stored scale is float32(1 / s) (the
//               dequantization multiplier the GEMM takes)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace titan::float8 {

enum class BlockElement { E4M3, E2M1 };  // float8 e4m3fn, fp4 e2m1
enum class MxScaleRounding { Floor, Rceil };

// The shape of one block and how its scale is stored.
struct BlockLayout {
  BlockElement element = BlockElement::E4M3;
  int64_t block_rows = 1;   // 1 (MX; blockwise activations) or 128 (blockwise weights)
  int64_t block_cols = 32;  // 32 (MX) or 128 (blockwise)
  bool e8m0_scales = true;  // MX: uint8 biased exponents; blockwise: float32 multipliers
  MxScaleRounding rounding = MxScaleRounding::Floor;  // MX only
};

BlockLayout mx_layout(BlockElement element, MxScaleRounding rounding);
BlockLayout blockwise_layout(int64_t block_rows);  // 1 (1 x 128) or 128 (128 x 128)

struct BlockScaledTensor {
  // [R, C] float8 e4m3fn, or [R, C / 2] uint8 holding two e2m1 codes per byte (column 2j in the
  // low nibble, 2j + 1 in the high nibble).
  at::Tensor data;
  // MX: uint8 [R, C / 32], biased E8M0 exponents. Blockwise: float32
  // [ceil(R / block_rows), ceil(C / 128)], each the multiplier that dequantizes its tile.
  at::Tensor scale;
  BlockLayout layout;
  int64_t rows = 0, cols = 0;              // the logical (unpacked) shape
  at::ScalarType orig_dtype = at::kFloat;  // what dequantize returns by default
};

// Quantizes a 2-D float32 / bfloat16 tensor [R, C] with blocks along its last dimension.
// MX needs C % 32 == 0 (torchao's to_mx has no padding; the converter skips such linears);
// blockwise tiles may be partial at the edges (their amax covers what exists). Throws
// std::invalid_argument naming the shape and the rule otherwise.
BlockScaledTensor quantize_blocks(const at::Tensor& x, const BlockLayout& layout);

// The original values as far as the format keeps them, in `dtype` (MX: torchao's to_dtype,
// the scale applied in `dtype`; blockwise: float32 data * scale, then `dtype`).
at::Tensor dequantize_blocks(const BlockScaledTensor& t, at::ScalarType dtype);

// Scale of each block as float32 (MX: 2^(e - 127), NaN for 255), shape of t.scale.
at::Tensor block_scales_as_float(const BlockScaledTensor& t);

// fp4 e2m1 codes (uint8, one per element, low 4 bits) of float32 values: round to nearest even
// on the e2m1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (torchao's
// f32_to_f4_unpacked, bit for bit, including what it makes of NaN); and back.
at::Tensor float_to_e2m1_codes(const at::Tensor& x);
at::Tensor e2m1_codes_to_float(const at::Tensor& codes);
// Two codes per byte, the even column in the low nibble; and back.
at::Tensor pack_e2m1(const at::Tensor& codes);
at::Tensor unpack_e2m1(const at::Tensor& packed);

enum class BlockGemmBackend { Auto, Emulated, CublasLt };
const char* block_gemm_backend_name(BlockGemmBackend backend);

// out[M, N] = dequantize(a)[M, K] @ dequantize(b)[N, K]^T in out_dtype. Both operands' blocks
// run along K. Emulated (any device): torchao's emulation, both operands dequantized to their
// orig_dtype and multiplied there (MX), or in float32 (blockwise). CublasLt (CUDA build, CUDA
// tensors): cuBLASLt's block-scaled GEMM, MXFP8 on sm100 (VEC32_UE8M0 scales in the swizzled
// layout), blockwise on sm90+ with CUDA >= 12.9 (VEC128_32F x BLK128x128_32F); anything else is
// refused with the requirement named. Auto: CublasLt for CUDA tensors where it applies,
// otherwise Emulated.
at::Tensor block_scaled_mm(const BlockScaledTensor& a, const BlockScaledTensor& b,
                           at::ScalarType out_dtype, BlockGemmBackend backend);

// The 128 x 4 swizzle cuBLASLt and torch._scaled_mm want for E8M0 scales: a [R, C / 32] uint8
// scale matrix padded to [ceil(R / 128) * 128, ceil((C / 32) / 4) * 4] with zeros and laid out
// tile by tile (torchao's to_blocked). Any device.
at::Tensor swizzle_mx_scales(const at::Tensor& scale);

// Human-readable summary for errors and logs: "mxfp8[floor]", "blockwise[128x128]".
std::string describe_layout(const BlockLayout& layout);

}  // namespace titan::float8
