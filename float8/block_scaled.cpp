#include "float8/block_scaled.h"

#include <ATen/ops/abs.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/ceil.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "float8/gemm.h"
#include "float8/kernels/fused_cast.h"
#include "util/cpu_features.h"
#ifdef TITAN_WITH_CUDA
#include "float8/block_scaled_cublaslt.h"
#endif

#include <c10/util/StringUtil.h>

namespace titan::float8 {

namespace {

constexpr int kE8M0Bias = 127;
constexpr int kE8M0Nan = 255;
constexpr double kE4M3Max = 448.0;
constexpr double kE2M1Max = 6.0;
constexpr float kFloat32MinNormal = 1.17549435e-38f;  // 2^-126
constexpr float kBlockwiseEps = 1e-12f;  // amax floor of the blockwise casts, in float32

// log2 of the element format's largest power of two: 256 = 2^8 (e4m3), 4 = 2^2 (e2m1).
int element_max_pow2(BlockElement e) { return e == BlockElement::E4M3 ? 8 : 2; }
double element_max(BlockElement e) { return e == BlockElement::E4M3 ? kE4M3Max : kE2M1Max; }

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

// Whether x's casts can take float8/kernels' CPU loops (Note [AVX2 kernel files]).
bool cpu_kernels_for(const at::Tensor& x) {
  return x.device().is_cpu() && fused_casts_enabled() && titan::util::cpu_has_avx2_kernels();
}

// e4m3 bytes of float32 values already clamped to the format's range. On the CPU the vectorized
// cast (multiplying by 1 is exact, and its clamp changes nothing here), bit for bit ATen's
// conversion, which is a scalar loop: it was half of an emulated MX step.
at::Tensor to_e4m3(const at::Tensor& in_range) {
  if (cpu_kernels_for(in_range))
    return fused_cast_cpu(in_range, at::scalar_tensor(1.0, in_range.options().dtype(at::kFloat)), at::kFloat8_e4m3fn);
  return in_range.to(at::kFloat8_e4m3fn);
}

// e4m3 elements as `dtype` values (exact: every e4m3 value is a bfloat16 and a float32). On the
// CPU a table lookup per byte instead of ATen's scalar conversion.
at::Tensor e4m3_values(const at::Tensor& data, at::ScalarType dtype) {
  if (cpu_kernels_for(data) && data.dim() == 2)
    return dequantize_to_float_cpu(data, at::scalar_tensor(1.0, data.options().dtype(at::kFloat))).to(dtype);
  return data.to(dtype);
}

void check_input(const at::Tensor& x, const BlockLayout& layout) {
  std::ostringstream os;
  if (x.dim() != 2) {
    os << "block-scaled cast of " << describe_layout(layout) << ": needs a 2-D tensor, got shape " << x.sizes();
    fail(os.str());
  }
  if (x.scalar_type() != at::kFloat && x.scalar_type() != at::kBFloat16) {
    os << "block-scaled cast: dtype " << c10::toString(x.scalar_type()) << " is not Float or BFloat16";
    fail(os.str());
  }
  if (layout.e8m0_scales && x.size(1) % layout.block_cols != 0) {
    os << "MX cast (" << describe_layout(layout) << "): the last dimension of shape " << x.sizes()
       << " must be a multiple of the block size " << layout.block_cols
       << " (MX blocks run along the GEMM's contraction dimension and are never padded)";
    fail(os.str());
  }
  if (layout.e8m0_scales && layout.element == BlockElement::E2M1 && x.size(1) % 2 != 0) fail("MXFP4: odd column count");
}

// torchao's FLOOR scale (to_mx): exponent bits of the block amax minus the element format's
// largest exponent; the float scale the data is divided by never drops below 2^-126 (torchao's
// guard against subnormal scales), although the stored exponent may say 2^-127.
std::pair<at::Tensor, at::Tensor> mx_floor(const at::Tensor& x3, const at::Tensor& max_abs, BlockElement e) {
  at::Tensor bits = max_abs.view(at::kInt);
  at::Tensor extracted = at::bitwise_and(at::bitwise_right_shift(bits, 23), 0xFF) - 127;
  at::Tensor unbiased = at::clamp(extracted - element_max_pow2(e), -kE8M0Bias, kE8M0Bias + 1);
  at::Tensor biased = (unbiased + kE8M0Bias).to(at::kByte);
  biased = at::where(at::isnan(max_abs), at::scalar_tensor(kE8M0Nan, biased.options()), biased);
  at::Tensor scale_fp32 = at::bitwise_left_shift(biased.to(at::kInt), 23).view(at::kFloat);
  scale_fp32 = at::clamp(scale_fp32, kFloat32MinNormal);
  at::Tensor data = x3 / scale_fp32;
  // e4m3 casts before PyTorch 2.12 do not saturate: clamp first (torchao does the same). The
  // fp4 conversion saturates by itself.
  if (e == BlockElement::E4M3) data = at::clamp(data, -kE4M3Max, kE4M3Max);
  return {biased, data};
}

// torchao's RCEIL scale (_to_mx_rceil, cuBLAS's "round the scale up"): the exponent of
// amax / max_elem rounded up, so no element overflows.
std::pair<at::Tensor, at::Tensor> mx_rceil(const at::Tensor& x3, const at::Tensor& max_abs, BlockElement e) {
  const double max_pos = element_max(e);
  at::Tensor descale = max_abs / max_pos;
  at::Tensor normal = (at::clamp(at::ceil(at::log2(descale)), -kE8M0Bias, kE8M0Bias) + kE8M0Bias).to(at::kByte);
  at::Tensor exponent = at::where(at::isnan(descale), at::scalar_tensor(255, normal.options()),
                                  at::where(at::isinf(descale), at::scalar_tensor(254, normal.options()), normal));
  at::Tensor one = at::scalar_tensor(1.0, descale.options());
  at::Tensor rcp = at::where(exponent == 255, descale,
                             at::where(exponent == 254, at::scalar_tensor(std::ldexp(1.0, -127), descale.options()),
                                       at::where(exponent == 0, one,
                                                 at::exp2(kE8M0Bias - exponent.to(at::kFloat)))));
  at::Tensor data = at::clamp(x3 * rcp, -max_pos, max_pos);
  return {exponent, data};
}

BlockScaledTensor quantize_mx(const at::Tensor& x, const BlockLayout& layout) {
  const int64_t R = x.size(0), C = x.size(1), bc = layout.block_cols;
  // torchao reduces in the source dtype (exact: max picks an element) and then goes to float32.
  at::Tensor x3 = x.contiguous().reshape({R, C / bc, bc});
  at::Tensor max_abs = at::amax(at::abs(x3), {-1}, /*keepdim=*/true).to(at::kFloat);
  x3 = x3.to(at::kFloat);
  auto [scale, data] = layout.rounding == MxScaleRounding::Floor ? mx_floor(x3, max_abs, layout.element)
                                                                 : mx_rceil(x3, max_abs, layout.element);
  BlockScaledTensor out;
  out.layout = layout;
  out.rows = R;
  out.cols = C;
  out.orig_dtype = x.scalar_type();
  out.scale = scale.reshape({R, C / bc});
  if (layout.element == BlockElement::E4M3) {
    out.data = to_e4m3(data).reshape({R, C});
  } else {
    out.data = pack_e2m1(float_to_e2m1_codes(data.reshape({R, C})));
  }
  return out;
}

// Blockwise: tiles of block_rows x 128 (edge tiles partial), one float32 multiplier each.
BlockScaledTensor quantize_blockwise(const at::Tensor& x, const BlockLayout& layout) {
  const int64_t R = x.size(0), C = x.size(1), br = layout.block_rows, bc = layout.block_cols;
  const int64_t tr = (R + br - 1) / br, tc = (C + bc - 1) / bc;
  // Pad with zeros to whole tiles: zeros never raise a tile's amax, so edge tiles see only
  // their own values.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor padded = at::constant_pad_nd(xf, {0, tc * bc - C, 0, tr * br - R}, 0.0);
  at::Tensor tiles = padded.reshape({tr, br, tc, bc});
  at::Tensor amax = at::amax(at::abs(tiles), {1, 3}, /*keepdim=*/true);  // [tr, 1, tc, 1]
  amax = at::clamp(amax, kBlockwiseEps).to(at::kDouble);
  at::Tensor scale = (kE4M3Max / amax).to(at::kFloat);
  at::Tensor data = to_e4m3(at::clamp(tiles * scale, -kE4M3Max, kE4M3Max));
  BlockScaledTensor out;
  out.layout = layout;
  out.rows = R;
  out.cols = C;
  out.orig_dtype = x.scalar_type();
  out.data = data.reshape({tr * br, tc * bc}).narrow(0, 0, R).narrow(1, 0, C).contiguous();
  out.scale = (1.0f / scale).reshape({tr, tc}).contiguous();  // float32 reciprocal: div_rn
  return out;
}

}  // namespace

BlockLayout mx_layout(BlockElement element, MxScaleRounding rounding) {
  BlockLayout l;
  l.element = element;
  l.block_rows = 1;
  l.block_cols = 32;
  l.e8m0_scales = true;
  l.rounding = rounding;
  return l;
}

BlockLayout blockwise_layout(int64_t block_rows) {
  if (block_rows != 1 && block_rows != 128)
    fail("blockwise float8 tiles are 1 x 128 or 128 x 128, not " + std::to_string(block_rows) + " x 128");
  BlockLayout l;
  l.element = BlockElement::E4M3;
  l.block_rows = block_rows;
  l.block_cols = 128;
  l.e8m0_scales = false;
  return l;
}

std::string describe_layout(const BlockLayout& layout) {
  if (layout.e8m0_scales) {
    return std::string(layout.element == BlockElement::E4M3 ? "mxfp8" : "mxfp4") + "[" +
           (layout.rounding == MxScaleRounding::Floor ? "floor" : "rceil") + "]";
  }
  return "blockwise[" + std::to_string(layout.block_rows) + "x" + std::to_string(layout.block_cols) + "]";
}

BlockScaledTensor quantize_blocks(const at::Tensor& x, const BlockLayout& layout) {
  check_input(x, layout);
  return layout.e8m0_scales ? quantize_mx(x, layout) : quantize_blockwise(x, layout);
}

at::Tensor block_scales_as_float(const BlockScaledTensor& t) {
  if (!t.layout.e8m0_scales) return t.scale;
  // torchao's get_fp_scale: pow(2, e - 127) in float32 (exact, 2^-127 is a float32 subnormal),
  // NaN for the NaN code.
  at::Tensor offset = t.scale.to(at::kShort) - kE8M0Bias;
  at::Tensor two = at::full_like(offset, 2.0, offset.options().dtype(at::kFloat));
  at::Tensor s = at::pow(two, offset);
  return at::where(t.scale != kE8M0Nan, s, at::scalar_tensor(NAN, s.options()));
}

at::Tensor dequantize_blocks(const BlockScaledTensor& t, at::ScalarType dtype) {
  const int64_t R = t.rows, C = t.cols;
  const BlockLayout& l = t.layout;
  if (l.e8m0_scales) {
    // torchao's to_dtype: elements and scales both in `dtype`, multiplied there.
    at::Tensor hp = l.element == BlockElement::E4M3 ? e4m3_values(t.data, dtype)
                                                    : e2m1_codes_to_float(unpack_e2m1(t.data)).to(dtype);
    hp = hp.reshape({-1, l.block_cols}) * block_scales_as_float(t).reshape({-1, 1}).to(dtype);
    return hp.reshape({R, C});
  }
  const int64_t tr = t.scale.size(0), tc = t.scale.size(1);
  at::Tensor data = at::constant_pad_nd(e4m3_values(t.data, at::kFloat), {0, tc * l.block_cols - C, 0, tr * l.block_rows - R}, 0.0);
  at::Tensor hp = data.reshape({tr, l.block_rows, tc, l.block_cols}) * t.scale.reshape({tr, 1, tc, 1});
  return hp.reshape({tr * l.block_rows, tc * l.block_cols}).narrow(0, 0, R).narrow(1, 0, C).to(dtype);
}

namespace {
// torchao's _f32_to_floatx_unpacked steps for e2m1 (2 exponent bits, 1 mantissa bit) on float32
// bit patterns (the CPU loop, e2m1_codes_cpu, takes the same steps eight lanes at a time).
constexpr int32_t kE2m1Mbits = 1, kE2m1ExpBias = 1, kF32Mbits = 23, kF32Bias = 127;
constexpr int32_t kE2m1MagicAdder = (1 << (kF32Mbits - kE2m1Mbits - 1)) - 1;
constexpr int32_t kE2m1DenormMaskInt = ((kF32Bias - kE2m1ExpBias) + (kF32Mbits - kE2m1Mbits) + 1) << kF32Mbits;
// (kE2m1ExpBias - kF32Bias) << kF32Mbits + kE2m1MagicAdder: negative, so adding it to a
// magnitude's bits never overflows int32.
constexpr int32_t kE2m1ValToAdd = (kE2m1ExpBias - kF32Bias) * (1 << kF32Mbits) + kE2m1MagicAdder;

float e2m1_denorm_mask_float() {
  float f;
  std::memcpy(&f, &kE2m1DenormMaskInt, 4);
  return f;
}
}  // namespace

// torchao's _f32_to_floatx_unpacked for e2m1. Off the CPU as tensor ops on the float32 bit
// patterns, so it runs where x lives (MXFP4 is emulated on every GPU titan runs on; a host loop
// made each CUDA cast a round trip through the CPU: 8.9 s per 8192^3 linear fwd+bwd on an H100);
// on the CPU the same steps as one loop. The integer steps are torchao's, so even a NaN gets its
// code; tests/test_block_scaled.cpp holds them one element at a time as the reference, and
// compares the CUDA form with the CPU's.
at::Tensor float_to_e2m1_codes(const at::Tensor& x) {
  const at::Tensor bits = x.to(at::kFloat).contiguous().view(at::kInt);
  if (cpu_kernels_for(bits)) return e2m1_codes_cpu(bits.view(at::kFloat));
  const at::Tensor sign = at::bitwise_and(bits, std::numeric_limits<int32_t>::min());
  const at::Tensor magnitude_bits = at::bitwise_xor(bits, sign);
  const at::Tensor magnitude = magnitude_bits.view(at::kFloat);
  // Denormal (and the round up to 1.0): the float adder rounds to a multiple of 0.5.
  const at::Tensor denormal = (magnitude + e2m1_denorm_mask_float()).view(at::kInt) - kE2m1DenormMaskInt;
  // Normal (and NaN, which fails both comparisons): rebias the exponent, round half to even.
  const at::Tensor mantissa_odd = at::bitwise_and(at::bitwise_right_shift(magnitude_bits, kF32Mbits - kE2m1Mbits), 1);
  const at::Tensor normal =
      at::bitwise_right_shift(magnitude_bits + kE2m1ValToAdd + mantissa_odd, kF32Mbits - kE2m1Mbits);
  // >= 6 saturates to 7 (all exponent and mantissa bits set); the low byte is kept, as a cast to
  // uint8 of the int32 code, before the sign goes into bit 3.
  at::Tensor code = at::where(magnitude >= 6.0, at::scalar_tensor(7, bits.options()),
                              at::where(magnitude < 1.0, denormal, normal));
  code = at::bitwise_or(at::bitwise_and(code, 0xFF), at::bitwise_and(at::bitwise_right_shift(sign, 28), 0x8));
  return code.to(at::kByte);
}

at::Tensor e2m1_codes_to_float(const at::Tensor& codes) {
  // The 16 values, computed where the codes live (no host table copied to the device on every
  // call): code = sign | exponent (2 bits) | mantissa (1 bit); exponent 0 is subnormal (0, 0.5).
  const at::Tensor code = at::arange(16, codes.options().dtype(at::kInt));
  const at::Tensor exponent = at::bitwise_right_shift(at::bitwise_and(code, 0x7), 1).to(at::kFloat);
  const at::Tensor half_mantissa = at::bitwise_and(code, 0x1).to(at::kFloat) * 0.5;
  const at::Tensor magnitude =
      at::where(exponent == 0, half_mantissa, at::exp2(exponent - 1) * (half_mantissa + 1));
  const at::Tensor table = at::where(at::bitwise_and(code, 0x8) != 0, -magnitude, magnitude);  // -0.0 for code 8
  const at::Tensor index = at::bitwise_and(codes, 0xF).to(at::kLong).reshape({-1});
  return at::index_select(table, 0, index).reshape(codes.sizes());
}

at::Tensor pack_e2m1(const at::Tensor& codes) {
  if (codes.dim() < 1 || codes.size(-1) % 2 != 0) fail("pack_e2m1: the last dimension must be even");
  at::Tensor flat = codes.contiguous().reshape({-1, 2});
  at::Tensor lo = flat.select(1, 0), hi = flat.select(1, 1);
  std::vector<int64_t> shape = codes.sizes().vec();
  shape.back() /= 2;
  return at::bitwise_or(lo, at::bitwise_left_shift(hi, 4)).reshape(shape);
}

at::Tensor unpack_e2m1(const at::Tensor& packed) {
  at::Tensor p = packed.contiguous();
  at::Tensor lo = at::bitwise_and(p, 0xF), hi = at::bitwise_right_shift(p, 4);
  std::vector<int64_t> shape = p.sizes().vec();
  shape.back() *= 2;
  return at::stack({lo, hi}, -1).reshape(shape);
}

const char* block_gemm_backend_name(BlockGemmBackend backend) {
  switch (backend) {
    case BlockGemmBackend::Auto: return "auto";
    case BlockGemmBackend::Emulated: return "emulated";
    case BlockGemmBackend::CublasLt: return "cublaslt";
  }
  return "?";
}

at::Tensor block_scaled_mm(const BlockScaledTensor& a, const BlockScaledTensor& b, at::ScalarType out_dtype,
                           BlockGemmBackend backend) {
  if (a.cols != b.cols || a.layout.block_cols != b.layout.block_cols || a.layout.element != b.layout.element) {
    std::ostringstream os;
    os << "block-scaled GEMM: operands [" << a.rows << ", " << a.cols << "] " << describe_layout(a.layout)
       << " and [" << b.rows << ", " << b.cols << "] " << describe_layout(b.layout)
       << " do not agree (out = A[M, K] @ B[N, K]^T needs the same K, block length and element)";
    fail(os.str());
  }
  const bool cuda = a.data.is_cuda();
  if (backend == BlockGemmBackend::Auto)
    backend = cuda && float8_cuda_compiled() && a.layout.element == BlockElement::E4M3 ? BlockGemmBackend::CublasLt
                                                                                      : BlockGemmBackend::Emulated;
  if (backend == BlockGemmBackend::CublasLt) {
    if (!cuda) fail("block-scaled GEMM: the cuBLASLt back end needs CUDA tensors");
#ifdef TITAN_WITH_CUDA
    return cublaslt_block_scaled_mm(a, b, out_dtype);
#else
    fail("block-scaled GEMM: this titan was built without CUDA (TITAN_CUDA=OFF)");
#endif
  }
  if (a.layout.e8m0_scales) {
    // torchao's emulated MX GEMM: each operand dequantized to its original dtype, mm there.
    at::Tensor ah = dequantize_blocks(a, a.orig_dtype);
    at::Tensor bh = dequantize_blocks(b, b.orig_dtype);
    return at::mm(ah, bh.t()).to(out_dtype);
  }
  return at::mm(dequantize_blocks(a, at::kFloat), dequantize_blocks(b, at::kFloat).t()).to(out_dtype);
}

at::Tensor swizzle_mx_scales(const at::Tensor& scale) {
  if (scale.dim() != 2) fail("swizzle_mx_scales: needs a 2-D scale matrix");
  const int64_t rows = scale.size(0), cols = scale.size(1);
  const int64_t rb = (rows + 127) / 128, cb = (cols + 3) / 4;
  at::Tensor padded = at::constant_pad_nd(scale, {0, cb * 4 - cols, 0, rb * 128 - rows}, 0);
  at::Tensor blocks = padded.view({rb, 128, cb, 4}).permute({0, 2, 1, 3});
  return blocks.reshape({-1, 4, 32, 4}).transpose(1, 2).reshape({rb * 128, cb * 4}).contiguous();
}

}  // namespace titan::float8
