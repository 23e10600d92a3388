// Block-scaled low precision on the CPU: MXFP8 / MXFP4 casts, dequantization and the three GEMMs
// of a linear equal to torchao's emulation bit for bit, and blockwise float8 equal to a plain
// PyTorch statement of the 1 x 128 / 128 x 128 tile math. The references come from
// scripts/reference/block_scaled_reference.py, run here with the venv's torch and the torchao
// that scripts/setup.sh installs (.deps/torchao); without them the tests report themselves skipped.
#include <ATen/Parallel.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_left_shift.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/randint.h>

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>

#include "float8/block_scaled.h"
#include "float8/block_scaled_linear.h"
#include "float8/convert.h"
#include "model/linear.h"
#include "tests/torchao_reference.h"

using namespace titan::float8;
namespace fs = std::filesystem;

namespace {

using titan_test::bytes;
using titan_test::OneThread;
using titan_test::same_bits;
using titan_test::sqnr;

const std::map<std::string, at::Tensor>* reference() { return titan_test::torchao_reference("block_scaled_reference.py"); }

const at::Tensor& expected(const std::string& name) { return titan_test::reference_tensor(*reference(), name); }

#define REQUIRE_REFERENCE() REQUIRE_TORCHAO_REFERENCE(reference())

// torchao's _f32_to_floatx_unpacked for e2m1, one element at a time with its integer steps: the
// reference float_to_e2m1_codes' tensor formulation must equal for every float32 bit pattern.
uint8_t e2m1_code_reference(float value) {
  constexpr int32_t kMbits = 1, kExpBias = 1, kF32Mbits = 23, kF32Bias = 127;
  constexpr uint32_t kMagicAdder = (1u << (kF32Mbits - kMbits - 1)) - 1;
  constexpr uint32_t kDenormMaskInt = uint32_t((kF32Bias - kExpBias) + (kF32Mbits - kMbits) + 1) << kF32Mbits;
  float denorm_mask_float;
  std::memcpy(&denorm_mask_float, &kDenormMaskInt, 4);
  const uint32_t val_to_add = uint32_t(int32_t(kExpBias - kF32Bias) * (1 << kF32Mbits)) + kMagicAdder;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  float a;
  std::memcpy(&a, &bits, 4);
  uint8_t code;
  if (a >= 6.0f) {
    code = 7;
  } else if (a < 1.0f) {
    float d = a + denorm_mask_float;
    uint32_t di;
    std::memcpy(&di, &d, 4);
    code = static_cast<uint8_t>(di - kDenormMaskInt);
  } else {
    const uint32_t mant_odd = (bits >> (kF32Mbits - kMbits)) & 1u;
    const uint32_t v = bits + val_to_add + mant_odd;
    code = static_cast<uint8_t>(static_cast<int32_t>(v) >> (kF32Mbits - kMbits));
  }
  return static_cast<uint8_t>(code | ((sign >> 28) & 0x8u));
}

}  // namespace

TEST_CASE("MX casts equal torchao's to_mx bit for bit, at every boundary", "[block_scaled][mx]") {
  REQUIRE_REFERENCE();
  for (const std::string input : {"special", "random"}) {
    for (const std::string dtype : {"f32", "bf16"}) {
      const at::Tensor& x = expected("cast/" + input + "/" + dtype + "/x");
      for (const std::string elem : {"e4m3", "e2m1"}) {
        for (const std::string mode : {"floor", "rceil"}) {
          const std::string key = "cast/" + input + "/" + dtype + "/" + elem + "/" + mode;
          INFO(key);
          const BlockLayout layout = mx_layout(elem == "e4m3" ? BlockElement::E4M3 : BlockElement::E2M1,
                                               mode == "floor" ? MxScaleRounding::Floor : MxScaleRounding::Rceil);
          const BlockScaledTensor q = quantize_blocks(x, layout);
          CHECK(same_bits(q.scale, expected(key + "/scale")));
          CHECK(same_bits(bytes(q.data), expected(key + "/data")));
          CHECK(same_bits(dequantize_blocks(q, x.scalar_type()), expected(key + "/dequant")));
        }
      }
    }
  }
}

TEST_CASE("the three MX GEMMs of a linear equal torchao's emulated mx_mm bit for bit", "[block_scaled][mx]") {
  REQUIRE_REFERENCE();
  OneThread one;
  for (const std::string shape : {"even", "remainder"}) {
    for (const std::string dtype : {"f32", "bf16"}) {
      const std::string base = "linear/" + shape + "/" + dtype;
      for (const std::string elem : {"e4m3", "e2m1"}) {
        for (const std::string mode : {"floor", "rceil"}) {
          const std::string key = base + "/" + elem + "/" + mode;
          INFO(key);
          BlockScaledRecipe recipe;
          recipe.name = key;
          recipe.activation = recipe.weight = mx_layout(elem == "e4m3" ? BlockElement::E4M3 : BlockElement::E2M1,
                                                        mode == "floor" ? MxScaleRounding::Floor : MxScaleRounding::Rceil);
          recipe.emulated_gemm = true;
          BlockScaledLinearCompute compute(recipe);
          at::Tensor x = expected(base + "/x").clone().requires_grad_();
          at::Tensor w = expected(base + "/w").clone().requires_grad_();
          at::Tensor y = compute.forward(x, w);
          y.backward(expected(base + "/grad_out"));
          CHECK(same_bits(y, expected(key + "/out")));
          CHECK(same_bits(x.grad(), expected(key + "/grad_input")));
          CHECK(same_bits(w.grad(), expected(key + "/grad_weight")));
          // How far each GEMM is from float64 (TITAN_F8_VERBOSE=1 prints it).
          const std::string hp = "linear/" + shape + "/" + dtype + "/hp";
          const double s_out = sqnr(expected(hp + "/out"), y), s_gi = sqnr(expected(hp + "/grad_input"), x.grad()),
                       s_gw = sqnr(expected(hp + "/grad_weight"), w.grad());
          if (std::getenv("TITAN_F8_VERBOSE"))
            std::cout << "SQNR " << key << ": out " << s_out << " dB, grad_input " << s_gi << " dB, grad_weight "
                      << s_gw << " dB\n";
          // Measured (CPU, these shapes): e4m3 27.3-28.5 dB per GEMM (rceil ~1 dB above floor: its
          // scale never lets an element saturate), e2m1 15.6-15.8 dB (1 mantissa bit against 3:
          // ~12 dB less); bfloat16 inputs change < 0.1 dB. The floors sit ~2.5 / ~3.5 dB under.
          const double floor_db = elem == "e4m3" ? 25.0 : 12.0;
          CHECK(s_out >= floor_db);
          CHECK(s_gi >= floor_db);
          CHECK(s_gw >= floor_db);
        }
      }
    }
  }
}

TEST_CASE("blockwise float8 casts and GEMMs equal the plain tile math", "[block_scaled][blockwise]") {
  REQUIRE_REFERENCE();
  OneThread one;
  for (const std::string shape : {"even", "remainder"}) {
    for (const int64_t tile_rows : {1, 128}) {
      const std::string key = "blockwise/cast/" + shape + "/" + std::to_string(tile_rows);
      INFO(key);
      const BlockScaledTensor q = quantize_blocks(expected(key + "/x"), blockwise_layout(tile_rows));
      CHECK(same_bits(bytes(q.data), expected(key + "/data")));
      CHECK(same_bits(q.scale, expected(key + "/scale")));
    }
    const std::string key = "blockwise/linear/" + shape;
    INFO(key);
    BlockScaledLinearCompute compute(block_scaled_recipe_from_name("blockwise"));
    at::Tensor x = expected(key + "/x").clone().requires_grad_();
    at::Tensor w = expected(key + "/w").clone().requires_grad_();
    at::Tensor y = compute.forward(x, w);
    y.backward(expected(key + "/grad_out"));
    CHECK(same_bits(y, expected(key + "/out")));
    CHECK(same_bits(x.grad(), expected(key + "/grad_input")));
    CHECK(same_bits(w.grad(), expected(key + "/grad_weight")));
  }
}

TEST_CASE("MX scales swizzle into cuBLASLt's 128 x 4 layout as torchao's to_blocked", "[block_scaled][mx]") {
  REQUIRE_REFERENCE();
  for (const std::string s : {"256x8", "200x7"}) {
    INFO(s);
    CHECK(same_bits(swizzle_mx_scales(expected("swizzle/" + s + "/in")).flatten(), expected("swizzle/" + s + "/out")));
  }
}

TEST_CASE("e2m1 codes: the tensor formulation equals torchao's per-element steps on every bit pattern class",
          "[block_scaled][mx]") {
  // Every bfloat16 bit pattern (the upper 16 bits: all exponents, NaNs, infinities, denormals,
  // both signs) and 2^20 random float32 patterns (the low mantissa bits decide the rounding).
  at::Tensor high = at::bitwise_left_shift(at::arange(65536, at::kInt), 16);
  at::Tensor random = at::randint(std::numeric_limits<int32_t>::min(), int64_t{1} << 31, {1 << 20}, at::kLong).to(at::kInt);
  const at::Tensor x = at::cat({high, random}).view(at::kFloat);
  const at::Tensor codes = float_to_e2m1_codes(x);
  REQUIRE(codes.scalar_type() == at::kByte);
  const float* src = x.data_ptr<float>();
  const uint8_t* got = codes.data_ptr<uint8_t>();
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (got[i] != e2m1_code_reference(src[i]) && mismatches++ == 0) first = i;
  INFO("first mismatch at " << first);
  CHECK(mismatches == 0);
}

TEST_CASE("e2m1 codes: every code round-trips, the grid rounds half to even and saturates", "[block_scaled][mx]") {
  at::Tensor codes = at::arange(16, at::kByte);
  CHECK(at::equal(float_to_e2m1_codes(e2m1_codes_to_float(codes)).index({at::indexing::Slice(1, 16)}),
                  codes.index({at::indexing::Slice(1, 16)})));
  const at::Tensor v = at::tensor({0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.5f, 100.0f, -0.3f});
  const at::Tensor expect = at::tensor({0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f, 6.0f, -0.5f});
  CHECK(at::equal(e2m1_codes_to_float(float_to_e2m1_codes(v)), expect));
  CHECK(at::equal(unpack_e2m1(pack_e2m1(codes.reshape({2, 8}))), codes.reshape({2, 8})));
  CHECK(pack_e2m1(at::tensor({1, 2}, at::kByte)).item<uint8_t>() == 0x21);  // even column in the low nibble
}

TEST_CASE("block-scaled shapes and recipes are checked with errors that name them", "[block_scaled]") {
  CHECK_THROWS_WITH(quantize_blocks(at::randn({4, 40}), mx_layout(BlockElement::E4M3, MxScaleRounding::Floor)),
                    Catch::Contains("[4, 40]") && Catch::Contains("multiple of the block size 32"));
  CHECK_THROWS_WITH(block_scaled_recipe_from_name("mxfp9"),
                    Catch::Contains("mxfp9") && Catch::Contains("mxfp8_cublas_rceil") && Catch::Contains("blockwise"));
  BlockScaledLinearCompute mx(block_scaled_recipe_from_name("mxfp8_cublas"));
  // 3 x 5 = 15 tokens: grad_weight's blocks along the tokens would be partial.
  CHECK_THROWS_WITH(mx.forward(at::randn({3, 5, 64}), at::randn({32, 64})),
                    Catch::Contains("15 tokens") && Catch::Contains("multiple of 32"));
  // The converter keeps linears whose features do not split into blocks.
  titan::model::Linear odd("layers.0.attention.wq", 96, 48), even("layers.0.attention.wk", 128, 64);
  MxOptions options;
  const ConversionReport report = convert_to_mx_training({&odd, &even}, options);
  REQUIRE(report.converted.size() == 1);
  CHECK(report.converted[0].first == "layers.0.attention.wk");
  REQUIRE(report.skipped.size() == 1);
  CHECK_THAT(report.skipped[0].second, Catch::Contains("not divisible by the block length 32"));
  // The auto filter (float8 rowwise's table: torchao has none for MX) skips small K/N.
  titan::model::Linear small("layers.0.attention.wq", 256, 256);
  options.auto_filter_small_kn = true;
  const ConversionReport filtered = convert_to_mx_training({&small}, options);
  REQUIRE(filtered.skipped.size() == 1);
  CHECK_THAT(filtered.skipped[0].second, Catch::Contains("auto_filter_small_kn"));
}
