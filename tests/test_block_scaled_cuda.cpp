// tests/test_block_scaled_cuda.cpp — the CUDA half of block-scaled training (MXFP8 and blockwise
// float8) against the CPU reference of float8/block_scaled.h:
//   * the fused casts (float8/kernels/block_cast.h) equal quantize_blocks() bit for bit, data and
//     scales, including the transposed ("dim1") casts, partial blockwise tiles, zero blocks,
//     subnormals, huge values, infinities, NaN blocks and RCEIL scales just above powers of two
//     (where float32 log2 rounding decides the exponent). One allowance: e4m3fn has two NaN codes,
//     0x7F and 0xFF; CUDA arithmetic makes NaNs positive, so both sides' 0xFF are read as 0x7F;
//   * cuBLASLt's block-scaled GEMMs equal block_scaled_mm(..., Emulated) within the bound below.
// The [cuda] cases need a GPU (tests/catch_main.cpp skips them without one); the GEMM cases also
// need the GPU generation cuBLASLt supports (MXFP8: sm100+; blockwise: sm90 with cuBLAS >= 12.9)
// and otherwise check the refusal message and WARN "SKIPPED" (Catch2 v2 has no SKIP).
#include <catch2/catch.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/exp2.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/where.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "float8/block_scaled.h"
#include "float8/kernels/block_cast.h"

#ifdef TITAN_WITH_CUDA
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <cublasLt.h>

#include "float8/block_scaled_cublaslt.h"
#endif

using namespace titan::float8;

namespace {

[[maybe_unused]] std::string thrown(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("block cast CUDA entry points refuse what they cannot run, naming it", "[block_scaled]") {
  const at::Tensor x = at::randn({4, 64});
  const BlockLayout mx = mx_layout(BlockElement::E4M3, MxScaleRounding::Floor);
  const BlockLayout fp4 = mx_layout(BlockElement::E2M1, MxScaleRounding::Floor);
  CHECK_FALSE(block_cast_cuda_applies(x, mx, false));  // a CPU tensor
  CHECK_FALSE(block_cast_cuda_applies(x, fp4, false));
#ifdef TITAN_WITH_CUDA
  CHECK_THROWS_AS(fused_quantize_blocks_cuda(x, mx, false), std::invalid_argument);
  CHECK(thrown([&] { fused_quantize_blocks_cuda(x, fp4, false); }).find("E2M1") != std::string::npos);
  // The cuBLASLt path refuses MXFP4 before it looks at devices.
  const BlockScaledTensor q = quantize_blocks(x, fp4);
  CHECK_THROWS_AS(cublaslt_block_scaled_mm(q, q, at::kFloat), std::invalid_argument);
  CHECK(thrown([&] { cublaslt_block_scaled_mm(q, q, at::kFloat); }) ==
        "MXFP4 has no cuBLASLt path in titan; it runs emulated");
#else
  CHECK_THROWS_AS(fused_quantize_blocks_cuda(x, mx, false), std::runtime_error);
#endif
}

#ifdef TITAN_WITH_CUDA

namespace {

// x [R, C] float32 whose rows (the blocks' direction) cover the special cases: row 0 zeros,
// row 1 subnormals, row 2 huge values with +-inf, row 3 NaNs (both signs), row 4 block amaxes
// 448 * 2^E * (1 + k 2^-23) (RCEIL's descale just above a power of two), the rest randn at
// magnitudes 2^-20 .. 2^20 per row. Rows that do not exist are left out.
at::Tensor make_input(int64_t R, int64_t C) {
  at::Tensor x = at::randn({R, C}) * at::exp2(at::randint(-20, 21, {R, 1}).to(at::kFloat));
  auto a = x.accessor<float, 2>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  if (R > 0) x[0].zero_();
  if (R > 1) x[1] = at::randn({C}) * 1e-39;  // float32 subnormals (< 2^-126 = 1.18e-38)
  if (R > 2) {
    x[2] = at::randn({C}) * 1e37;
    a[2][0] = 3.0e38f;
    if (C > 40) a[2][40] = inf;
    if (C > 70) a[2][C - 1] = -inf;
  }
  if (R > 3) {
    if (C > 5) a[3][5] = nan;
    if (C > 40) a[3][C - 1] = -nan;
  }
  if (R > 4) {
    at::Tensor u = at::rand({C}) * 1.8 - 0.9;  // |u| < 1: the planted value is each block's amax
    auto ua = u.accessor<float, 1>();
    for (int64_t b = 0; b * 32 < C; ++b) {
      const int E = -30 + static_cast<int>((b * 7) % 60), k = 1 + static_cast<int>(b % 5);
      const float am = std::ldexp(1.0f + static_cast<float>(k) * 0x1p-23f, E) * 448.0f;
      for (int64_t j = 0; j < 32 && b * 32 + j < C; ++j) a[4][b * 32 + j] = j == 0 ? am : am * ua[b * 32 + j];
    }
  }
  return x;
}

// The e4m3 bytes with 0xFF (NaN, sign set) read as 0x7F (NaN).
at::Tensor canonical_bytes(const at::Tensor& data) {
  at::Tensor b = data.cpu().view(at::kByte);
  return at::where(b == 0xFF, at::scalar_tensor(0x7F, b.options()), b);
}

// Scale bits: uint8 as they are; float32 as int32 with every NaN one pattern.
at::Tensor canonical_scale(const at::Tensor& scale) {
  at::Tensor s = scale.cpu().contiguous();
  if (s.scalar_type() == at::kByte) return s;
  at::Tensor bits = s.view(at::kInt);
  return at::where(at::isnan(s), at::scalar_tensor(0x7FC00000, bits.options()), bits);
}

void check_same(const BlockScaledTensor& got, const BlockScaledTensor& want) {
  CHECK(got.rows == want.rows);
  CHECK(got.cols == want.cols);
  CHECK(got.orig_dtype == want.orig_dtype);
  REQUIRE(got.data.sizes() == want.data.sizes());
  REQUIRE(got.scale.sizes() == want.scale.sizes());
  CHECK(got.data.scalar_type() == want.data.scalar_type());
  CHECK(got.scale.scalar_type() == want.scale.scalar_type());
  CHECK(at::equal(canonical_scale(got.scale), canonical_scale(want.scale)));
  CHECK(at::equal(canonical_bytes(got.data), canonical_bytes(want.data)));
}

struct CastCase {
  BlockLayout layout;
  std::vector<std::pair<int64_t, int64_t>> dim0;  // shapes of x for the dim0 cast
  std::vector<std::pair<int64_t, int64_t>> dim1;  // shapes of x for the transposed cast
};

BlockScaledTensor to_device(const BlockScaledTensor& t, const at::Device& device) {
  BlockScaledTensor out = t;
  out.data = t.data.to(device);
  out.scale = t.scale.to(device);
  return out;
}

// a [M, K] and b [N, K] with magnitudes that differ by row and by `group`-column group (2^-6 ..
// 2^6 each), so that a scale applied to the wrong block shows as an O(1) error. `group` is the
// layout's scale block (32 for MX, 128 blockwise): a spread inside one block would test only the
// tensor cores' accumulator, whose ~14-bit running sum drops products 2^12 below the others
// (measured on an H200, 2026-11-27: 32-column groups inside 128-column blocks gave errors up to
// 2^-10.7 S, above the bound below; block-sized groups stay under it).
at::Tensor gemm_operand(int64_t rows, int64_t K, int64_t group) {
  const int64_t n_groups = (K + group - 1) / group;
  at::Tensor groups = at::exp2(at::randint(-6, 7, {1, n_groups, 1}).to(at::kFloat));
  groups = groups.expand({1, n_groups, group}).reshape({1, -1}).narrow(1, 0, K);
  return at::randn({rows, K}) * at::exp2(at::randint(-6, 7, {rows, 1}).to(at::kFloat)) * groups;
}

// Error bound of the GEMM comparison, elementwise, with S = |deq(a)| @ |deq(b)|^T in float64:
//   |y - ref| <= (2 (K + 8) 2^-24 + (block / 32) 2^-13) S + u_out |ref|
// Products of e4m3 values are exact, so what differs is rounding: both sides accumulate in
// float32 (cuBLASLt: CUBLAS_COMPUTE_32F; emulation: CPU float32 mm), each within
// (K - 1) 2^-24 S of the exact sum (the classical bound, to first order), and a few more float32
// roundings per term for the scale multiplications (blockwise: the emulation dequantizes in
// float32, cuBLASLt scales each 128-long partial sum); hence 2 (K + 8) 2^-24 S. The second term
// is the float8 tensor cores' accumulator: Hopper keeps about 14 bits of the running sum
// (DeepSeek-V3's measurement, the reason the partial sums are promoted to float32 once per
// scale block), so each of the block / 32 MMA steps (k = 32 for float8) inside one scale block
// (block = 128 columns blockwise, 32 for MX) may lose up to 2^-13 of that block's S, products of
// like magnitude assumed (gemm_operand says why). u_out is the output rounding: 2^-8 for
// bfloat16 (2^-9 relative, doubled), 2^-23 for float.
// A wrong scale layout puts 2^k-off scales on whole blocks: errors of order S, far outside.
void check_gemm(const at::Tensor& y, const BlockScaledTensor& a, const BlockScaledTensor& b,
                at::ScalarType out, const std::string& what) {
  const BlockScaledTensor ac = to_device(a, at::kCPU), bc = to_device(b, at::kCPU);
  const at::Tensor ref = block_scaled_mm(ac, bc, at::kFloat, BlockGemmBackend::Emulated).to(at::kDouble);
  const at::Tensor S = at::mm(dequantize_blocks(ac, at::kDouble).abs(), dequantize_blocks(bc, at::kDouble).abs().t());
  const double K = static_cast<double>(a.cols);
  const double u_out = out == at::kBFloat16 ? 0x1p-8 : 0x1p-23;
  const double mma_steps = static_cast<double>(a.layout.block_cols) / 32.0;
  const at::Tensor bound = S * (2.0 * (K + 8.0) * 0x1p-24 + mma_steps * 0x1p-13) + ref.abs() * u_out;
  REQUIRE(y.scalar_type() == out);
  REQUIRE(y.sizes() == ref.sizes());
  const at::Tensor err = (y.cpu().to(at::kDouble) - ref).abs();
  const double worst = (err - bound).max().item<double>();
  INFO(what << ": max(|y - ref| - bound) = " << worst << ", max |y - ref| = "
            << err.max().item<double>() << ", max S = " << S.max().item<double>());
  CHECK(worst <= 0.0);
}

}  // namespace

TEST_CASE("CUDA block-scaled casts equal quantize_blocks bit for bit", "[block_scaled][cuda]") {
  if (!at::hasCUDA()) return;
  at::manual_seed(21);
  const std::vector<CastCase> cases = {
      {mx_layout(BlockElement::E4M3, MxScaleRounding::Floor), {{64, 96}, {33, 320}, {1, 32}},
       {{96, 48}, {64, 37}, {32, 1}}},
      {mx_layout(BlockElement::E4M3, MxScaleRounding::Rceil), {{64, 96}, {33, 320}, {1, 32}},
       {{96, 48}, {64, 37}, {32, 1}}},
      {blockwise_layout(1), {{70, 300}, {5, 128}, {3, 1000}}, {{300, 70}, {128, 5}, {130, 3}}},
      {blockwise_layout(128), {{200, 300}, {128, 256}, {129, 1}}, {{200, 300}, {128, 256}, {1, 129}}},
  };
  for (const CastCase& c : cases) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (bool transposed : {false, true}) {
        for (const auto& [R, C] : transposed ? c.dim1 : c.dim0) {
          // Transposed: x^T (what is quantized) carries the special rows.
          const at::Tensor x = (transposed ? make_input(C, R).t().contiguous() : make_input(R, C)).to(dtype);
          INFO(describe_layout(c.layout) << " " << c10::toString(dtype) << " x [" << R << ", " << C << "]"
                                         << (transposed ? " transposed" : ""));
          const at::Tensor xc = x.cuda();
          REQUIRE(block_cast_cuda_applies(xc, c.layout, transposed));
          const BlockScaledTensor got = fused_quantize_blocks_cuda(xc, c.layout, transposed);
          CHECK(got.data.is_cuda());
          CHECK(got.scale.is_cuda());
          const BlockScaledTensor want = quantize_blocks(transposed ? x.t().contiguous() : x, c.layout);
          check_same(got, want);
        }
      }
    }
  }
  // What the kernels cannot do is refused, never approximated.
  const at::Tensor odd = at::randn({33, 64}, at::kCUDA);
  const BlockLayout mx = mx_layout(BlockElement::E4M3, MxScaleRounding::Floor);
  CHECK_FALSE(block_cast_cuda_applies(odd, mx, /*transposed=*/true));  // 33 rows: no 32-blocks
  CHECK_THROWS_AS(fused_quantize_blocks_cuda(odd, mx, true), std::invalid_argument);
  CHECK_FALSE(block_cast_cuda_applies(odd.to(at::kHalf), mx, false));
  CHECK_THROWS_AS(fused_quantize_blocks_cuda(odd, mx_layout(BlockElement::E2M1, MxScaleRounding::Rceil), false),
                  std::invalid_argument);
}

TEST_CASE("CUDA e2m1 codes and their values equal the CPU's bit for bit", "[block_scaled][cuda]") {
  if (!at::hasCUDA()) return;
  // MXFP4 is emulated on every GPU: its casts run on the device as tensor ops (no host round
  // trip); the CPU formulation is checked against torchao's per-element steps in
  // tests/test_block_scaled.cpp. Random float32 bit patterns cover NaN, inf and denormals.
  at::manual_seed(23);
  const at::Tensor x = at::randint(std::numeric_limits<int32_t>::min(), int64_t{1} << 31, {1 << 20}, at::kLong)
                           .to(at::kInt)
                           .view(at::kFloat);
  const at::Tensor codes = float_to_e2m1_codes(x);
  const at::Tensor codes_cuda = float_to_e2m1_codes(x.cuda());
  CHECK(codes_cuda.is_cuda());
  CHECK(at::equal(codes_cuda.cpu(), codes));
  const at::Tensor values_cuda = e2m1_codes_to_float(codes.cuda());
  CHECK(values_cuda.is_cuda());
  CHECK(at::equal(values_cuda.cpu().view(at::kInt), e2m1_codes_to_float(codes).view(at::kInt)));  // -0.0 too
}

TEST_CASE("CUDA MXFP8 cuBLASLt GEMM matches the emulation", "[block_scaled][cuda]") {
  if (!at::hasCUDA()) return;
  at::manual_seed(22);
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  const int64_t M = 200, N = 144, K = 320;  // M: 128-row swizzle tiles padded; K / 32 = 10 -> 12
  for (MxScaleRounding rounding : {MxScaleRounding::Floor, MxScaleRounding::Rceil}) {
    const BlockLayout layout = mx_layout(BlockElement::E4M3, rounding);
    const BlockScaledTensor a = to_device(quantize_blocks(gemm_operand(M, K, 32), layout), at::kCUDA);
    const BlockScaledTensor b = to_device(quantize_blocks(gemm_operand(N, K, 32), layout), at::kCUDA);
    if (prop.major < 10) {
      CHECK(thrown([&] { cublaslt_block_scaled_mm(a, b, at::kBFloat16); })
                .find("MXFP8 GEMM needs a Blackwell (sm100+) GPU; this is sm") == 0);
      WARN("SKIPPED: MXFP8 cuBLASLt GEMM needs sm100+, this is sm" << prop.major << prop.minor);
      return;
    }
    for (at::ScalarType out : {at::kFloat, at::kBFloat16}) {
      check_gemm(cublaslt_block_scaled_mm(a, b, out), a, b, out,
                 describe_layout(layout) + " -> " + c10::toString(out));
      // block_scaled_mm's Auto back end (cuBLASLt for CUDA operands) gives the same.
      check_gemm(block_scaled_mm(a, b, out, BlockGemmBackend::Auto), a, b, out, "auto");
    }
  }
}

TEST_CASE("CUDA blockwise float8 cuBLASLt GEMMs match the emulation", "[block_scaled][cuda]") {
  if (!at::hasCUDA()) return;
  at::manual_seed(23);
  const cudaDeviceProp& prop = *at::cuda::getCurrentDeviceProperties();
  const BlockLayout act = blockwise_layout(1), weight = blockwise_layout(128);
  // K = 320: a partial last K tile, and 3 k blocks padded to 4 for BLK128x128; N = 144 and
  // M = 200: partial 128-row tiles.
  const int64_t M = 200, N = 144, K = 320;
  const auto q = [&](int64_t rows, const BlockLayout& l) {
    return to_device(quantize_blocks(gemm_operand(rows, K, 128), l), at::kCUDA);
  };
  const BlockScaledTensor x = q(M, act), w = q(N, weight), g = q(N, act), wa = q(M, weight);
  if (prop.major < 9) {
    CHECK(thrown([&] { cublaslt_block_scaled_mm(x, w, at::kBFloat16); }).find("needs a Hopper (sm90+)") !=
          std::string::npos);
  }
  if (prop.major != 9 || CUBLAS_VERSION < 120900 || cublasLtGetVersion() < 120900) {
    WARN("SKIPPED: blockwise cuBLASLt GEMMs are checked on sm90 with cuBLAS >= 12.9; this is sm"
         << prop.major << prop.minor << ", cuBLAS " << CUBLAS_VERSION << " (built) / "
         << cublasLtGetVersion() << " (loaded)");
    return;
  }
  for (at::ScalarType out : {at::kFloat, at::kBFloat16}) {
    const std::string o = std::string(" -> ") + c10::toString(out);
    check_gemm(cublaslt_block_scaled_mm(x, w, out), x, w, out, "1x128 x 128x128 (forward)" + o);
    check_gemm(cublaslt_block_scaled_mm(x, g, out), x, g, out, "1x128 x 1x128 (grad_weight)" + o);
    check_gemm(cublaslt_block_scaled_mm(wa, g, out), wa, g, out, "128x128 x 1x128" + o);
  }
  CHECK_THROWS_AS(cublaslt_block_scaled_mm(wa, w, at::kFloat), std::invalid_argument);  // 128x128 twice
}

#endif
