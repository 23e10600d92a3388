// tests/test_float8.cpp — float8 and int8 training numerics against high precision.
//
// Thresholds are those of torchao's own tests (docs/float8.md "Tests and benchmarks") or tighter.
// Why they hold: e4m3 keeps 3 mantissa bits, so round-to-nearest has a relative error of at most
// 2^-4 (uniform, rms about 2^-4 / sqrt(3)); over normally distributed values that is a cast SQNR
// near 30 dB, ~27 dB for e5m2's 2 bits (its wider exponent covers the tails). A GEMM adds the
// errors of two operands (-3 dB), and errors that compound through two GEMMs (FFN) or use e5m2
// gradients cost a few dB more, hence 25 dB for single casts and GEMMs, 18 / 17 dB for the tiny
// Linear(16, 32) whose 16-term dot products average little, and 20 dB for the FFN. All seeds are
// fixed.
#include <catch2/catch.hpp>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "float8/convert.h"
#include "float8/float8_linear.h"
#include "float8/gemm.h"
#include "float8/int8_linear.h"
#include "float8/kernels/fused_cast.h"
#include "float8/recipe.h"
#include "float8/scaling.h"
#include "model/linear.h"

using namespace titan::float8;
using titan::model::Linear;

namespace {

// SQNR(x, y) = 20 log10(||x|| / ||x - y||) in dB, computed in float64.
double sqnr(const at::Tensor& ref, const at::Tensor& actual) {
  at::Tensor r = ref.detach().to(at::kDouble), a = actual.detach().to(at::kDouble);
  const double signal = r.norm().item<double>(), noise = (r - a).norm().item<double>();
  return noise == 0.0 ? std::numeric_limits<double>::infinity() : 20.0 * std::log10(signal / noise);
}

// TITAN_F8_VERBOSE=1 prints every measured SQNR (the numbers quoted in reports).
double logged(const std::string& what, double db) {
  if (std::getenv("TITAN_F8_VERBOSE")) std::cout << "SQNR " << what << " = " << db << " dB\n";
  return db;
}

bool all_finite(const at::Tensor& t) { return at::isfinite(t.to(at::kFloat)).all().item<bool>(); }

std::string thrown_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

at::Tensor param(const at::Tensor& t) { return t.clone().detach().requires_grad_(true); }

void sgd_step(const at::Tensor& w, double lr) {
  at::NoGradGuard no_grad;
  w.sub_(w.grad() * lr);
  w.mutable_grad().zero_();
}

}  // namespace

// ---------------------------------------------------------------------------------- recipes

TEST_CASE("recipe names, aliases and their settings", "[float8][recipe]") {
  Float8Recipe t = recipe_from_name("tensorwise");
  CHECK(t.grad_output.dtype == at::kFloat8_e5m2);
  CHECK(t.input.granularity == ScalingGranularity::Tensorwise);
  CHECK(t.use_fast_accum_output);
  CHECK_FALSE(t.round_scales_to_power_of_2);

  Float8Recipe r = recipe_from_name("all_axiswise");
  CHECK(r.name == "rowwise");
  CHECK(r.grad_output.dtype == at::kFloat8_e4m3fn);
  CHECK(r.grad_output.granularity == ScalingGranularity::Axiswise);
  CHECK(r.round_scales_to_power_of_2);

  Float8Recipe gw = recipe_from_name("lw_axiswise_with_gw_hp");
  CHECK(gw.name == "rowwise_with_gw_hp");
  CHECK(gw.grad_weight_high_precision);
  CHECK(gw.weight_for_grad_input.granularity == ScalingGranularity::Tensorwise);
  CHECK(gw.weight.granularity == ScalingGranularity::Axiswise);

  Float8Recipe d = recipe_from_name("tensorwise_delayed");
  CHECK(d.delayed);
  CHECK(d.amax_history_len == 16);
}

TEST_CASE("an unknown recipe name lists the valid names", "[float8][recipe]") {
  CHECK_THROWS_AS(recipe_from_name("rowise"), std::invalid_argument);
  const std::string msg = thrown_message([] { recipe_from_name("rowise"); });
  CHECK(msg.find("'rowise'") != std::string::npos);
  for (const std::string& n : recipe_names()) CHECK(msg.find(n) != std::string::npos);
  CHECK(msg.find("all_axiswise") != std::string::npos);
}

// ---------------------------------------------------------------------------------- casts

TEST_CASE("cast round trip SQNR >= 25 dB for both dtypes and granularities", "[float8][cast]") {
  for (at::ScalarType hp : {at::kFloat, at::kBFloat16}) {
    for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (ScalingGranularity g : {ScalingGranularity::Tensorwise, ScalingGranularity::Axiswise}) {
        for (bool pow2 : {false, true}) {
          at::manual_seed(0);
          at::Tensor x = (at::randn({64, 128}) * 3).to(hp);
          Float8Tensor t = to_float8(x, CastConfig{g, f8}, -1, pow2);
          CHECK(t.data.scalar_type() == f8);
          CHECK(t.orig_dtype == hp);
          if (g == ScalingGranularity::Axiswise) {
            CHECK(t.scale.sizes() == at::IntArrayRef({64, 1}));
          } else {
            CHECK(t.scale.dim() == 0);
          }
          const at::Tensor y = dequantize(t);
          CHECK(y.scalar_type() == hp);
          const std::string what = std::string("cast ") + c10::toString(hp) + "->" +
                                   c10::toString(f8) + " " + granularity_name(g) +
                                   (pow2 ? " pow2" : "");
          CHECK(logged(what, sqnr(x, y)) >= 25.0);
        }
      }
    }
  }
}

TEST_CASE("scale is fp8_max / amax divided in float64", "[float8][cast]") {
  const std::vector<double> amaxes = {1e-3, 0.7, 3.3, 448.0, 1e5, 0.1};
  at::Tensor a = at::tensor(std::vector<float>(amaxes.begin(), amaxes.end()));
  at::Tensor s = scale_from_amax(a, at::kFloat8_e4m3fn, false);
  CHECK(s.scalar_type() == at::kFloat);
  for (size_t i = 0; i < amaxes.size(); ++i) {
    const double amax_f = static_cast<double>(static_cast<float>(amaxes[i]));
    CHECK(s[i].item<float>() == static_cast<float>(448.0 / amax_f));
  }
  CHECK(float8_max(at::kFloat8_e5m2) == 57344.0);
  CHECK_THROWS_AS(float8_max(at::kFloat), std::invalid_argument);
}

TEST_CASE("saturation: huge scale -> +-max, tiny scale -> 0, overflow never NaN",
          "[float8][cast]") {
  at::manual_seed(1);
  at::Tensor x = at::randn({32, 32});
  x = x + x.sign() * 1e-3;  // no exact zeros
  for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    const double m = float8_max(f8);
    at::Tensor big = cast_to_float8(x, at::full({}, 1e30f), f8).to(at::kFloat);
    CHECK(at::equal(big.abs(), at::full({32, 32}, static_cast<float>(m))));
    CHECK(at::equal(big.sign(), x.sign()));
    at::Tensor tiny = cast_to_float8(x, at::full({}, 1e-30f), f8).to(at::kFloat);
    CHECK(at::equal(tiny.abs(), at::zeros({32, 32})));
  }
  // c10's unclamped cast turns these into NaN before PyTorch 2.12; the clamp saturates them.
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor edge = at::tensor(std::vector<float>{500.f, -1000.f, 480.f, 449.f, inf, -inf});
  at::Tensor c = cast_to_float8(edge, at::ones({}), at::kFloat8_e4m3fn).to(at::kFloat);
  CHECK(at::equal(c, at::tensor(std::vector<float>{448.f, -448.f, 448.f, 448.f, 448.f, -448.f})));
}

TEST_CASE("zero tensors and zero rows get finite scales and no NaN", "[float8][cast]") {
  for (bool pow2 : {false, true}) {
    for (ScalingGranularity g : {ScalingGranularity::Tensorwise, ScalingGranularity::Axiswise}) {
      Float8Tensor z = to_float8(at::zeros({8, 16}), CastConfig{g, at::kFloat8_e4m3fn}, -1, pow2);
      CHECK(all_finite(z.scale));
      CHECK(at::equal(dequantize(z), at::zeros({8, 16})));
    }
    at::manual_seed(2);
    at::Tensor x = at::randn({8, 16});
    x[3].zero_();
    Float8Tensor t = to_float8(x, CastConfig{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn},
                               -1, pow2);
    CHECK(all_finite(t.scale));
    at::Tensor y = dequantize(t);
    CHECK_FALSE(at::isnan(y).any().item<bool>());
    CHECK(at::equal(y[3], at::zeros({16})));
    CHECK(sqnr(x, y) >= 25.0);
  }
}

TEST_CASE("power-of-2 scale rounding edge cases", "[float8][cast]") {
  at::Tensor exact = at::tensor(std::vector<float>{1.f, 2.f, 0.5f, 1024.f, std::ldexp(1.f, -20)});
  CHECK(at::equal(round_scale_to_power_of_2(exact), exact));
  at::Tensor inexact = at::tensor(std::vector<float>{3.f, 0.75f, 1000.f, 1.9999f});
  CHECK(at::equal(round_scale_to_power_of_2(inexact),
                  at::tensor(std::vector<float>{2.f, 0.5f, 512.f, 1.f})));
  // amax 0 -> 448 / 1e-12 -> 2^48 (finite).
  at::Tensor s0 = scale_from_amax(at::zeros({}), at::kFloat8_e4m3fn, true);
  CHECK(s0.item<float>() == std::ldexp(1.f, 48));
  // float32 log2(FLT_MAX) rounds to 128, so torchao's formula yields inf; so does ours.
  at::Tensor big = at::full({}, std::numeric_limits<float>::max());
  CHECK(std::isinf(round_scale_to_power_of_2(big).item<float>()));
}

TEST_CASE("3-D activations: the scale follows the data", "[float8][cast]") {
  at::manual_seed(3);
  at::Tensor x = at::randn({2, 3, 16});
  Float8Tensor t = to_float8(x, CastConfig{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn}, -1);
  CHECK(t.scale.sizes() == at::IntArrayRef({2, 3, 1}));
  Float8Tensor t2 = reshape_to_2d(t);
  CHECK(t2.data.sizes() == at::IntArrayRef({6, 16}));
  CHECK(t2.scale.sizes() == at::IntArrayRef({6, 1}));
  CHECK(at::equal(dequantize(t2), dequantize(t).reshape({6, 16})));
  Float8Tensor back = reshape(t2, {2, 3, 16});
  CHECK(back.scale.sizes() == at::IntArrayRef({2, 3, 1}));
  // The broken state (3-D data, flattened 2-D scale) is rejected with both shapes named.
  Float8Tensor broken{t.data, t.scale.reshape({6, 1}), at::kFloat};
  const std::string msg = thrown_message([&] { check_float8_tensor(broken, "test"); });
  CHECK(msg.find("[6, 1]") != std::string::npos);
  CHECK(msg.find("[2, 3, 16]") != std::string::npos);
  CHECK_THROWS_AS(reshape(t, {2, 48}), std::invalid_argument);  // last dim must be kept
  // Column scales (1, K) transpose to (K, 1) together with the data.
  Float8Tensor cols = to_float8(at::randn({6, 16}),
                                CastConfig{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn}, 0);
  CHECK(cols.scale.sizes() == at::IntArrayRef({1, 16}));
  Float8Tensor ct = transpose_2d(cols);
  CHECK(ct.data.sizes() == at::IntArrayRef({16, 6}));
  CHECK(ct.scale.sizes() == at::IntArrayRef({16, 1}));
  // Tensorwise scales stay 0-dim through reshapes.
  Float8Tensor tw = to_float8(x, CastConfig{}, -1);
  CHECK(reshape_to_2d(tw).scale.dim() == 0);
}

// ---------------------------------------------------------------------------------- GEMM

TEST_CASE("scaled GEMM vs high precision >= 25 dB, fp32 and bf16 outputs", "[float8][gemm]") {
  at::manual_seed(4);
  // Columns of B span 4 orders of magnitude: one tensorwise scale pushes the small ones into
  // e4m3's subnormals, per-column scales do not.
  at::Tensor A = at::randn({64, 128});
  at::Tensor B = at::randn({128, 96}) * at::pow(10.0, at::linspace(-2, 2, 96)).to(at::kFloat);
  const at::Tensor ref = at::mm(A, B);
  const CastConfig axis{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};
  const CastConfig tensor{ScalingGranularity::Tensorwise, at::kFloat8_e4m3fn};
  struct Case {
    const char* name;
    CastConfig a, b;
  };
  for (const Case& c : {Case{"axiswise", axis, axis}, Case{"tensorwise", tensor, tensor},
                        Case{"axiswise x tensorwise", axis, tensor}}) {
    for (at::ScalarType out : {at::kFloat, at::kBFloat16}) {
      for (bool pow2 : {false, true}) {
        Float8Tensor a8 = to_float8(A, c.a, -1, pow2), b8 = to_float8(B, c.b, 0, pow2);
        at::Tensor y = scaled_mm(a8, b8, out, /*use_fast_accum=*/true, GemmBackend::Auto);
        CHECK(y.scalar_type() == out);  // rowwise with fp32 output must work (fp32 params)
        CHECK(logged(std::string("gemm ") + c.name + " " + c10::toString(out) +
                         (pow2 ? " pow2" : ""),
                     sqnr(ref, y)) >= 25.0);
      }
    }
  }
}

TEST_CASE("emulated GEMM in tiles equals the whole-operand formula up to float32 summation order",
          "[float8][gemm]") {
  // Note [Emulated GEMM in tiles]: K = 1024 gives 256-row / 256-column tiles, so A [300, K] x
  // B [K, 200] takes 2 row tiles of A (B whole) and A [200, K] x B [K, 600] 3 column tiles of B
  // (A whole), written in place into the strided output, both with ragged edges and transposed
  // operands (the grad_weight GEMM's G^T). Each element is the same float32 dot product over K,
  // blocked differently by BLAS: the difference is bounded by the float32 summation error of K
  // terms, 2 K eps sum|a_k b_k| (eps = 2^-24), elementwise.
  at::manual_seed(21);
  const CastConfig axis{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};
  const CastConfig tensor{ScalingGranularity::Tensorwise, at::kFloat8_e4m3fn};
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{300, 200}, std::pair<int64_t, int64_t>{200, 600}})
  for (const auto& cfg : {axis, tensor}) {
    at::Tensor A = at::randn({m, 1024}), B = at::randn({n, 1024}).t();  // B [1024, n], strided
    Float8Tensor a8 = transpose_2d(to_float8(A.t().contiguous(), cfg, 0, true));  // [m, 1024], strided
    Float8Tensor b8 = to_float8(B, cfg, 0, true);
    at::Tensor a32 = a8.data.to(at::kFloat) / a8.scale, b32 = b8.data.to(at::kFloat) / b8.scale;
    at::Tensor formula = at::mm(a32, b32);
    at::Tensor tiled = scaled_mm(a8, b8, at::kFloat, false, GemmBackend::Emulated);
    at::Tensor bound = at::mm(a32.abs(), b32.abs()) * (2.0 * 1024 * std::ldexp(1.0, -24));
    CHECK(tiled.sizes() == formula.sizes());
    CHECK(((tiled - formula).abs() <= bound).all().item<bool>());
    CHECK(logged("tiled emulation vs formula", sqnr(formula, tiled)) > 100.0);
  }
}

TEST_CASE("fused CPU casts and dequantization equal the ATen composite bit for bit", "[float8][cast]") {
  // Note [Fused CPU casts]: to_float8 on the CPU runs one amax pass and one cast pass; the
  // composite (abs, amax, multiply, clamp, convert) must give the same bytes and scales,
  // including zeros, values that saturate, subnormal results, inf and NaN.
  at::manual_seed(5);
  // Bit for bit, except that a NaN only has to be a NaN: IEEE 754 leaves the sign and payload of
  // a NaN out of max and products, and ATen's own CPU kernels differ there (the AVX2 maximum
  // ORs in an all-ones mask), while the float8 cast keeps the sign (0x7f vs 0xff).
  auto same = [](const at::Tensor& a, const at::Tensor& b) {
    if (a.sizes() != b.sizes()) return false;
    at::Tensor fa = a.to(at::kFloat).reshape({-1}), fb = b.to(at::kFloat).reshape({-1});
    at::Tensor nan = at::isnan(fa);
    if (!at::equal(nan, at::isnan(fb))) return false;
    at::Tensor ba = a.contiguous().reshape({-1}).view(at::kByte).reshape({fa.numel(), -1});
    at::Tensor bb = b.contiguous().reshape({-1}).view(at::kByte).reshape({fb.numel(), -1});
    at::Tensor keep = (~nan).unsqueeze(1).expand_as(ba);
    return at::equal(at::masked_select(ba, keep), at::masked_select(bb, keep));
  };
  at::Tensor base = at::randn({3, 5, 67}) * at::pow(10.0, at::randint(-6, 6, {3, 5, 67}).to(at::kFloat));
  base.select(0, 1).select(0, 2).zero_();  // an all-zero row
  at::Tensor special = base.clone();
  special.view(-1)[7] = std::numeric_limits<float>::infinity();
  special.view(-1)[300] = std::numeric_limits<float>::quiet_NaN();
  int checked = 0;
  for (const at::Tensor& src : {base, base.to(at::kBFloat16), special}) {
    for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (bool pow2 : {false, true}) {
        for (auto g : {ScalingGranularity::Tensorwise, ScalingGranularity::Axiswise}) {
          const CastConfig cfg{g, f8};
          // rows of a 3-D activation (axis -1), and columns of a 2-D one (axis 0)
          for (const auto& [x, axis] : {std::pair<at::Tensor, int64_t>{src, -1},
                                        std::pair<at::Tensor, int64_t>{src.reshape({15, 67}), 0}}) {
            INFO(c10::toString(x.scalar_type()) << " -> " << c10::toString(f8) << " pow2 " << pow2
                 << " axiswise " << (g == ScalingGranularity::Axiswise) << " axis " << axis);
            Float8Tensor fused = to_float8(x, cfg, axis, pow2);
            Float8Tensor ref = to_float8_composite(x, cfg, axis, pow2);
            REQUIRE(fused.data.sizes() == ref.data.sizes());
            REQUIRE(fused.scale.sizes() == ref.scale.sizes());
            CHECK(same(fused.data, ref.data));
            CHECK(same(fused.scale, ref.scale));
            // The GEMM's one-pass dequantization: data.to(float32) / scale, in either memory order.
            Float8Tensor f2 = reshape_to_2d(fused);
            CHECK(same(dequantize_to_float_cpu(f2.data, f2.scale), f2.data.to(at::kFloat) / f2.scale));
            Float8Tensor t2 = transpose_2d(f2);
            CHECK(same(dequantize_to_float_cpu(t2.data, t2.scale), t2.data.to(at::kFloat) / t2.scale));
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked == 48);
}

TEST_CASE("vectorized float8 conversion equals c10's scalar one on every exponent and rounding case",
          "[float8][cast]") {
  // Note [Vectorized float8 conversion]: the CPU cast converts 8 lanes with integer arithmetic.
  // Inputs: every float32 whose high 16 bits are anything (sign, exponent, the top 7 mantissa
  // bits) and whose low 16 bits are one of 8 patterns that put the dropped bits below, at and
  // above the half-way point of both formats' rounding (e4m3 drops 20 bits, e5m2 21); and every
  // bf16 value (all 65536). Scale 1, so the cast is clamp(x, -max, max) then the conversion.
  std::vector<int32_t> bits;
  for (uint32_t hi = 0; hi < 65536; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x4000u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu})
      bits.push_back(static_cast<int32_t>(hi << 16 | lo));
  const at::Tensor f32 = at::tensor(bits).view(at::kFloat);
  const at::Tensor bf16 = (at::tensor(bits).view(at::kFloat)).index_select(0, at::arange(0, f32.numel(), 8)).to(at::kBFloat16);
  const at::Tensor one = at::ones({}, at::kFloat);
  for (const at::Tensor& x : {f32, bf16}) {
    for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      INFO(c10::toString(x.scalar_type()) << " -> " << c10::toString(f8));
      const double m = float8_max(f8);
      const at::Tensor got = fused_cast_cpu(x, one, f8).view(at::kByte);
      const at::Tensor want = x.to(at::kFloat).clamp(-m, m).to(f8).view(at::kByte);
      const at::Tensor nan = at::isnan(x.to(at::kFloat));
      // Not NaN: the same byte. NaN: a NaN byte of the format with any sign (IEEE 754 leaves a
      // NaN's sign out of products and clamps; both formats' NaN is 0x7f, e5m2 also 0x7d, 0x7e).
      CHECK(at::equal(at::masked_select(got, ~nan), at::masked_select(want, ~nan)));
      const at::Tensor nan_bytes = at::masked_select(got, nan).bitwise_and(0x7f);
      CHECK(at::isnan(nan_bytes.view(f8).to(at::kFloat)).all().item<bool>());
      CHECK(nan.sum().item<int64_t>() > 0);
    }
  }
  // And back: the one-pass dequantization of every byte of both formats (subnormals, zeros of
  // both signs, inf and NaN) equals to(float32) / scale; 40 columns: vector body and tail.
  const at::Tensor every_byte = at::arange(256, at::kInt).to(at::kByte).repeat({2}).reshape({-1, 1}).repeat({1, 40});
  for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
    INFO(c10::toString(f8));
    const at::Tensor data = every_byte.view(f8);
    const at::Tensor scale = at::full({}, 0.75, at::kFloat);
    const at::Tensor got = dequantize_to_float_cpu(data, scale), want = data.to(at::kFloat) / scale;
    const at::Tensor nan = at::isnan(want);
    CHECK(at::equal(at::isnan(got), nan));
    CHECK(at::equal(at::masked_select(got, ~nan).view(at::kInt), at::masked_select(want, ~nan).view(at::kInt)));
  }
}

TEST_CASE("fused CPU casts give the same bits on 1 and 2 intra-op threads", "[float8][cast]") {
  // Note [OpenMP in titan's kernels]: per-row, per-column-block and per-element work, and maxima
  // (exact in any order): the thread count cannot change a byte. 1M elements: above the grain.
  auto run = [](int threads) {
    at::set_num_threads(threads);
    at::manual_seed(8);
    const at::Tensor x = at::randn({1024, 1024});
    std::vector<at::Tensor> out;
    for (auto g : {ScalingGranularity::Tensorwise, ScalingGranularity::Axiswise})
      for (int64_t axis : {-1, 0}) {
        Float8Tensor t = to_float8(x, CastConfig{g, at::kFloat8_e4m3fn}, axis, false);
        out.push_back(t.data.view(at::kByte));
        out.push_back(t.scale);
        out.push_back(dequantize_to_float_cpu(t.data, t.scale));
      }
    return out;
  };
  const int before = at::get_num_threads();
  const std::vector<at::Tensor> one = run(1), two = run(2);
  at::set_num_threads(before);
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("output " << i);
    CHECK(at::equal(one[i], two[i]));
  }
}

TEST_CASE("scaled GEMM validates operands", "[float8][gemm]") {
  at::Tensor A = at::randn({8, 32}), B = at::randn({32, 16});
  const CastConfig axis{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};
  // a scaled per column varies along K: the scale cannot leave the sum.
  Float8Tensor bad = to_float8(A, axis, 0);
  CHECK_THROWS_AS(scaled_mm(bad, to_float8(B, axis, 0), at::kFloat, false, GemmBackend::Auto),
                  std::invalid_argument);
  CHECK_THROWS_AS(scaled_mm(to_float8(A, axis, -1), to_float8(A, axis, -1), at::kFloat, false,
                            GemmBackend::Auto),
                  std::invalid_argument);
  if (!float8_cuda_compiled()) {
    CHECK_THROWS_AS(resolve_gemm_backend(GemmBackend::ScaledMm, false, at::kCPU),
                    std::invalid_argument);
  }
  CHECK(resolve_gemm_backend(GemmBackend::Auto, false, at::kCPU) == GemmBackend::Emulated);
}

// ---------------------------------------------------------------------------------- linear

TEST_CASE("Float8Linear vs Linear(16, 32): two steps, every recipe", "[float8][linear]") {
  const std::vector<std::vector<int64_t>> shapes = {{16, 16}, {2, 16, 16}, {3, 2, 16, 16}};
  for (const std::string& name : recipe_names()) {
    for (const auto& shape : shapes) {
      at::manual_seed(5);
      const at::Tensor w0 = at::randn({32, 16}) / 4;
      at::Tensor w_ref = param(w0);
      Linear lin("layers.0.feed_forward.w1", 16, 32);
      lin.weight = param(w0);
      auto compute = std::make_shared<Float8LinearCompute>(recipe_from_name(name));
      lin.set_compute(compute);
      for (int step = 0; step < 2; ++step) {
        at::Tensor x = at::randn(shape);
        at::Tensor x_ref = param(x), x_f8 = param(x);
        at::Tensor y_ref = at::linear(x_ref, w_ref);
        at::Tensor y = lin.forward(x_f8);
        REQUIRE(y.sizes() == y_ref.sizes());
        at::Tensor g = at::randn(y_ref.sizes());
        y_ref.backward(g);
        y.backward(g);
        REQUIRE(x_f8.grad().sizes() == x.sizes());
        const std::string what = "linear16x32 " + name + " rank" + std::to_string(shape.size()) +
                                 " step" + std::to_string(step);
        CHECK(logged(what + " output", sqnr(y_ref, y)) >= 18.0);
        CHECK(logged(what + " grad_weight", sqnr(w_ref.grad(), lin.weight.grad())) >= 17.0);
        CHECK(logged(what + " grad_input", sqnr(x_ref.grad(), x_f8.grad())) >= 17.0);
        if (compute->recipe().delayed) sync_amax_history({compute.get()});
        // lr 1e-2 moves the weights by a few percent (grads sum over up to 96 rows): a
        // realistic step that delayed scaling must absorb with its one-step-old weight scale.
        sgd_step(w_ref, 1e-2);
        sgd_step(lin.weight, 1e-2);
      }
    }
  }
}

TEST_CASE("Llama FFN w2(silu(w1 x) * w3 x) > 20 dB for output and every grad, every recipe",
          "[float8][linear][ffn]") {
  const int64_t dim = 256, hidden = 768;
  for (const std::string& name : recipe_names()) {
    at::manual_seed(6);
    const at::Tensor w1 = at::randn({hidden, dim}) / std::sqrt(double(dim));
    const at::Tensor w3 = at::randn({hidden, dim}) / std::sqrt(double(dim));
    const at::Tensor w2 = at::randn({dim, hidden}) / std::sqrt(double(hidden));
    const at::Tensor x = at::randn({2, 128, dim});  // 256 tokens
    const at::Tensor g = at::randn({2, 128, dim});
    std::vector<at::Tensor> ref = {param(w1), param(w2), param(w3), param(x)};
    std::vector<at::Tensor> f8 = {param(w1), param(w2), param(w3), param(x)};
    // One compute per linear: delayed scaling keeps per-linear amax histories.
    titan::model::HighPrecisionLinearCompute hp;
    std::vector<std::unique_ptr<Float8LinearCompute>> f8c;
    for (int i = 0; i < 3; ++i) {
      f8c.push_back(std::make_unique<Float8LinearCompute>(recipe_from_name(name)));
    }
    auto ffn = [](const std::vector<at::Tensor>& p, titan::model::LinearCompute& c1,
                  titan::model::LinearCompute& c2, titan::model::LinearCompute& c3) {
      return c2.forward(at::silu(c1.forward(p[3], p[0])) * c3.forward(p[3], p[2]), p[1]);
    };
    at::Tensor y_ref = ffn(ref, hp, hp, hp), y = ffn(f8, *f8c[0], *f8c[1], *f8c[2]);
    y_ref.backward(g);
    y.backward(g);
    CHECK(logged("ffn " + name + " output", sqnr(y_ref, y)) > 20.0);
    const char* names[] = {"w1", "w2", "w3", "x"};
    for (int i = 0; i < 4; ++i) {
      CHECK(logged("ffn " + name + " grad " + names[i], sqnr(ref[i].grad(), f8[i].grad())) > 20.0);
    }
  }
}

TEST_CASE("bf16 Float8Linear keeps dtypes and accuracy", "[float8][linear]") {
  for (const std::string& name : recipe_names()) {
    at::manual_seed(7);
    at::Tensor w = param(at::randn({64, 32}).to(at::kBFloat16));
    at::Tensor x = param(at::randn({4, 8, 32}).to(at::kBFloat16));
    Float8LinearCompute c(recipe_from_name(name));
    at::Tensor y = c.forward(x, w);
    CHECK(y.scalar_type() == at::kBFloat16);
    y.backward(at::ones_like(y));
    CHECK(w.grad().scalar_type() == at::kBFloat16);
    CHECK(x.grad().scalar_type() == at::kBFloat16);
    CHECK(sqnr(at::linear(x.detach().to(at::kFloat), w.detach().to(at::kFloat)), y) >= 20.0);
  }
}

TEST_CASE("delayed scaling: history per operand, one collective per sync", "[float8][delayed]") {
  Float8Recipe recipe = recipe_from_name("tensorwise_delayed");
  recipe.amax_history_len = 4;
  Float8LinearCompute a(recipe), b(recipe), dynamic(recipe_from_name("tensorwise"));
  at::manual_seed(8);
  at::Tensor wa = param(at::randn({32, 16})), wb = param(at::randn({16, 32}));
  std::vector<float> input_amaxes;
  int calls = 0;
  auto all_reduce_max = [&](at::Tensor& t) {
    ++calls;
    CHECK(t.numel() == 6);  // 2 delayed computes x 3 operands, stacked into ONE tensor
  };
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = param(at::randn({8, 16}) * (step + 1));
    input_amaxes.push_back(x.detach().abs().max().item<float>());
    b.forward(a.forward(x, wa), wb).sum().backward();
    CHECK(a.state().input.amax.item<float>() == input_amaxes.back());
    sync_amax_history({&a, &b, &dynamic}, all_reduce_max);
    CHECK(calls == step + 1);
    const AmaxHistory& h = a.state().input;
    CHECK(h.amax.item<float>() == 0.0f);  // cleared for the next step
    for (int i = 0; i <= step; ++i) CHECK(h.history[i].item<float>() == input_amaxes[step - i]);
    const float history_max = *std::max_element(input_amaxes.begin(), input_amaxes.end());
    CHECK(h.scale.item<float>() ==
          scale_from_amax(at::full({}, history_max), at::kFloat8_e4m3fn, false).item<float>());
    CHECK(a.state().grad_output.initialized);
    CHECK(b.state().weight.initialized);
  }
  // The collective's result is what enters the history (e.g. a larger amax on another rank).
  at::Tensor x = at::randn({8, 16});
  a.forward(x, wa);
  const float local = a.state().input.amax.item<float>();
  sync_amax_history({&a}, [](at::Tensor& t) { t.mul_(2); });
  CHECK(a.state().input.history[0].item<float>() == 2 * local);
  // Only non-delayed computes: nothing to reduce, no collective.
  calls = 0;
  sync_amax_history({&dynamic}, all_reduce_max);
  CHECK(calls == 0);
}

// ---------------------------------------------------------------------------------- conversion

TEST_CASE("convert_to_float8_training: filters and their reasons", "[float8][convert]") {
  std::vector<std::unique_ptr<Linear>> owned;
  auto add = [&](const std::string& fqn, int64_t in, int64_t out) {
    owned.push_back(std::make_unique<Linear>(fqn, in, out));
    return owned.back().get();
  };
  std::vector<Linear*> linears = {add("layers.0.attention.wq", 256, 256),
                                  add("layers.0.feed_forward.w2", 768, 256),
                                  add("output", 256, 1000),
                                  add("layers.0.odd", 100, 256)};
  Float8Options opts;
  opts.emulate = true;
  ConversionReport rep = convert_to_float8_training(linears, opts);
  REQUIRE(rep.converted.size() == 2);
  CHECK(rep.converted[0].first == "layers.0.attention.wq");
  CHECK(rep.converted[0].second == "float8[tensorwise,emulated]");
  REQUIRE(rep.skipped.size() == 2);
  CHECK(rep.skipped[0].first == "output");
  CHECK(rep.skipped[0].second.find("filter_fqns") != std::string::npos);
  CHECK(rep.skipped[1].first == "layers.0.odd");
  CHECK(rep.skipped[1].second.find("not divisible by 16") != std::string::npos);
  CHECK(float8_computes(linears).size() == 2);
  // A second conversion leaves converted linears alone and says why.
  ConversionReport again = convert_to_float8_training({linears[0]}, opts);
  CHECK(again.converted.empty());
  REQUIRE(again.skipped.size() == 1);
  CHECK(again.skipped[0].second.find("already") != std::string::npos);

  // torchao's auto_filter_small_kn thresholds (K = in_features, N = out_features).
  CHECK(auto_filter_skip_reason("tensorwise", 4096, 1024) != "");
  CHECK(auto_filter_skip_reason("tensorwise", 4096, 14336) == "");
  CHECK(auto_filter_skip_reason("tensorwise", 8192, 1024) == "");
  CHECK(auto_filter_skip_reason("rowwise", 8192, 2048).find("N <= 2048") != std::string::npos);
  CHECK(auto_filter_skip_reason("rowwise", 1024, 8192).find("K <= 1024") != std::string::npos);
  CHECK(auto_filter_skip_reason("rowwise", 2048, 4096) != "");
  CHECK(auto_filter_skip_reason("rowwise", 4096, 4096) == "");
  CHECK(auto_filter_skip_reason("all_axiswise", 4096, 14336) == "");
  Float8Options autof;
  autof.recipe_name = "rowwise";
  autof.auto_filter_small_kn = true;
  autof.filter_fqns = {};
  Linear small("layers.1.attention.wk", 4096, 1024), big("layers.1.feed_forward.w1", 4096, 14336);
  ConversionReport ar = convert_to_float8_training({&small, &big}, autof);
  REQUIRE(ar.skipped.size() == 1);
  CHECK(ar.skipped[0].first == "layers.1.attention.wk");
  CHECK(ar.skipped[0].second.find("auto_filter_small_kn") != std::string::npos);
  CHECK(ar.converted.at(0).second == "float8[rowwise]");
  // torchtitan 0.2.x spells the switch as a filter_fqns entry: the same filter, and no linear
  // is skipped for "containing" it.
  Float8Options entry;
  entry.recipe_name = "rowwise";
  entry.filter_fqns = {"output", "auto_filter_small_kn"};
  Linear small2("layers.1.attention.wk", 4096, 1024), big2("layers.1.feed_forward.w1", 4096, 14336);
  ConversionReport er = convert_to_float8_training({&small2, &big2}, entry);
  REQUIRE(er.skipped.size() == 1);
  CHECK(er.skipped[0].second.find("auto_filter_small_kn: K=4096, N=1024") != std::string::npos);
  CHECK(er.converted.size() == 1);
}

TEST_CASE("validate_float8_options rejects impossible combinations", "[float8][convert]") {
  Float8Options o;
  o.enable_fsdp_float8_all_gather = true;
  CHECK_NOTHROW(validate_float8_options(o));
  o.recipe_name = "rowwise";
  const std::string msg = thrown_message([&] { validate_float8_options(o); });
  CHECK(msg.find("enable_fsdp_float8_all_gather") != std::string::npos);
  CHECK(msg.find("axiswise") != std::string::npos);
  o.recipe_name = "rowwise_with_gw_hp";  // tensorwise for grad_input, axiswise for output
  CHECK_THROWS_AS(validate_float8_options(o), std::invalid_argument);
  o.recipe_name = "tensorwise_delayed";
  CHECK_THROWS_AS(validate_float8_options(o), std::invalid_argument);
  Float8Options p;
  p.precompute_float8_dynamic_scale_for_fsdp = true;
  CHECK(thrown_message([&] { validate_float8_options(p); }).find("enable_fsdp_float8_all_gather") !=
        std::string::npos);
  Float8Options h;
  h.amax_history_len = 0;
  CHECK_THROWS_AS(validate_float8_options(h), std::invalid_argument);
  Float8Options bad;
  bad.recipe_name = "fp8";
  CHECK(thrown_message([&] { validate_float8_options(bad); }).find("tensorwise") !=
        std::string::npos);
}

TEST_CASE("convert_to_int8_training uses the same filters", "[int8][convert]") {
  Linear a("layers.0.attention.wo", 64, 64), out("output", 64, 128), odd("layers.0.x", 64, 40);
  Int8Options opts;
  opts.gemms.grad_weight = false;
  ConversionReport rep = convert_to_int8_training({&a, &out, &odd}, opts);
  REQUIRE(rep.converted.size() == 1);
  CHECK(rep.converted[0].second == "int8[output,grad_input]");
  CHECK(rep.skipped.size() == 2);
}

// ---------------------------------------------------------------------------------- int8

TEST_CASE("int8 rowwise quantization formula", "[int8]") {
  // Row 0: amax 127 -> scale 1; round half to even: 63.5 -> 64, -0.5 -> 0, 2.5 -> 2, 1.5 -> 2.
  at::Tensor t = at::tensor(std::vector<float>{127.f, 63.5f, -0.5f, 2.5f, 1.5f, -127.f,
                                               0.f, 0.f, 0.f, 0.f, 0.f, 0.f})
                     .reshape({2, 6});
  Int8Tensor q = quantize_int8_rowwise(t);
  CHECK(q.data.scalar_type() == at::kChar);
  CHECK(at::equal(q.data[0].to(at::kFloat),
                  at::tensor(std::vector<float>{127.f, 64.f, 0.f, 2.f, 2.f, -127.f})));
  CHECK(q.scale[0].item<float>() == 1.0f);
  CHECK(q.scale[1].item<float>() == 0.0f);  // zero row: eps guards the division, q = 0
  CHECK(at::equal(q.data[1].to(at::kFloat), at::zeros({6})));
  // The scale keeps the source dtype.
  CHECK(quantize_int8_rowwise(t.to(at::kBFloat16)).scale.scalar_type() == at::kBFloat16);
}

TEST_CASE("int8 GEMM accumulation is exact int32", "[int8]") {
  at::manual_seed(9);
  at::Tensor a = at::randint(-128, 128, {37, 300}, at::kChar);
  at::Tensor b = at::randint(-128, 128, {300, 29}, at::kChar);
  const at::Tensor ref = at::mm(a.to(at::kLong), b.to(at::kLong));  // exact integer reference
  at::Tensor emu = int8_mm(a, b, Int8MmBackend::Emulated);
  CHECK(emu.scalar_type() == at::kInt);
  CHECK(at::equal(emu.to(at::kLong), ref));
  CHECK(at::equal(int8_mm(a, b, Int8MmBackend::Auto).to(at::kLong), ref));   // either, by the CPU
  CHECK(at::equal(int8_mm(a, b, Int8MmBackend::IntMm).to(at::kLong), ref));  // at::_int_mm itself
  // Worst case magnitude: 4096 products of (-128)^2 = 2^26.
  at::Tensor lo = at::full({4, 4096}, -128, at::kChar);
  at::Tensor acc = int8_mm(lo, lo.t(), Int8MmBackend::Emulated);
  CHECK(acc[0][0].item<int32_t>() == 128 * 128 * 4096);
  CHECK_THROWS_AS(int8_mm(a, a, Int8MmBackend::Auto), std::invalid_argument);
}

TEST_CASE("Int8Linear 64 -> 64, batch 64: output and grads > 20 dB", "[int8][linear]") {
  for (Int8MmBackend backend : {Int8MmBackend::Auto, Int8MmBackend::Emulated}) {
    at::manual_seed(10);
    const at::Tensor w0 = at::randn({64, 64}) / 8, x0 = at::randn({64, 64});
    at::Tensor w_ref = param(w0), x_ref = param(x0), w = param(w0), x = param(x0);
    Int8LinearCompute c({}, backend);
    at::Tensor y_ref = at::linear(x_ref, w_ref), y = c.forward(x, w);
    at::Tensor g = at::randn({64, 64});
    y_ref.backward(g);
    y.backward(g);
    const std::string b = backend == Int8MmBackend::Auto ? "int_mm" : "emulated";
    CHECK(logged("int8 " + b + " output", sqnr(y_ref, y)) > 20.0);
    CHECK(logged("int8 " + b + " grad_input", sqnr(x_ref.grad(), x.grad())) > 20.0);
    CHECK(logged("int8 " + b + " grad_weight", sqnr(w_ref.grad(), w.grad())) > 20.0);
  }
  // All three GEMMs switched to high precision: identical to at::linear.
  at::manual_seed(11);
  at::Tensor w = param(at::randn({64, 64})), x = param(at::randn({2, 32, 64}));
  Int8LinearCompute hp(Int8GemmSwitches{false, false, false});
  CHECK(hp.describe() == "int8[none]");
  at::Tensor y = hp.forward(x, w);
  CHECK(at::allclose(y, at::linear(x, w)));
  y.sum().backward();
  CHECK(x.grad().sizes() == x.sizes());
}

// ---------------------------------------------------------------------------------- CUDA

#ifdef TITAN_WITH_CUDA
TEST_CASE("CUDA scaled_mm back ends match the emulation", "[float8][cuda]") {
  if (!at::hasCUDA()) return;
  at::manual_seed(12);
  const CastConfig axis{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};
  const CastConfig tensor{ScalingGranularity::Tensorwise, at::kFloat8_e4m3fn};
  for (int64_t K : {128, 72}) {  // 72: padded to 80 by the back end
    at::Tensor A = at::randn({48, K}, at::kCUDA), B = at::randn({K, 40}, at::kCUDA);
    for (auto cfgs : {std::make_pair(tensor, tensor), std::make_pair(axis, axis),
                      std::make_pair(axis, tensor)}) {
      Float8Tensor a8 = to_float8(A, cfgs.first, -1, true), b8 = to_float8(B, cfgs.second, 0, true);
      for (at::ScalarType out : {at::kFloat, at::kBFloat16}) {
        for (bool fast : {false, true}) {
          at::Tensor emu = scaled_mm(a8, b8, out, fast, GemmBackend::Emulated);
          for (GemmBackend be : {GemmBackend::ScaledMm, GemmBackend::CublasLt}) {
            at::Tensor y = scaled_mm(a8, b8, out, fast, be);
            CHECK(y.scalar_type() == out);
            CHECK(logged(std::string("cuda ") + gemm_backend_name(be), sqnr(emu, y)) > 35.0);
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA outer_scale equals the ATen composite bit for bit", "[float8][cuda]") {
  // The rescale after a rowwise GEMM without fast accumulation (gemm_epilogue.cuh): two float32
  // products in the composite's order, each rounded, then one conversion: equal, not close.
  // 40 columns take the four-wide path, 37 the one-element path; the third case is strided
  // (not contiguous), which the kernel leaves to the composite.
  at::manual_seed(21);
  for (int64_t cols : {40, 37}) {
    const at::Tensor x = at::randn({53, cols}, at::kCUDA) * 1e4;
    const at::Tensor row = at::rand({53, 1}, at::kCUDA) + 1e-3, col = at::rand({1, cols}, at::kCUDA) + 1e-3;
    for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
      const at::Tensor want = (x * row * col).to(dtype);
      CHECK(at::equal(outer_scale(x.clone(), row, col, dtype), want));
    }
  }
  const at::Tensor xt = at::randn({40, 53}, at::kCUDA).t();
  const at::Tensor row = at::rand({53, 1}, at::kCUDA), col = at::rand({1, 40}, at::kCUDA);
  CHECK(at::equal(outer_scale(xt, row, col, at::kBFloat16), (xt * row * col).to(at::kBFloat16)));
}

TEST_CASE("CUDA to_float8 takes the fused kernels and equals the ATen composite", "[float8][cuda]") {
  // Note [Fused casts on the hot path]: 3-D per-row (scale follows the data), 2-D per-column
  // (column-major data), tensorwise; bit for bit, values and scale shapes.
  if (!at::hasCUDA()) return;
  at::manual_seed(14);
  const CastConfig axis{ScalingGranularity::Axiswise, at::kFloat8_e4m3fn};
  const CastConfig tensor{ScalingGranularity::Tensorwise, at::kFloat8_e5m2};
  at::Tensor x3 = (at::randn({2, 9, 48}) * 3).to(at::kCUDA, at::kBFloat16);
  at::Tensor x2 = (at::randn({40, 24}) * 3).to(at::kCUDA);
  struct Case { at::Tensor x; CastConfig cfg; int64_t axis; };
  // Tensorwise along dim 0 of a 2-D x: the same values, laid out column-major for the backward
  // GEMMs (no float8 transpose copy in scaled_mm).
  for (const Case& c : {Case{x3, axis, -1}, Case{x3, tensor, -1}, Case{x2, axis, 0}, Case{x2, axis, -1},
                        Case{x2, tensor, 0}}) {
    REQUIRE(try_fused_to_float8(c.x, c.cfg, c.axis, true).has_value());
    Float8Tensor got = to_float8(c.x, c.cfg, c.axis, true);
    Float8Tensor want = to_float8_composite(c.x, c.cfg, c.axis, true);
    CHECK(got.data.sizes() == want.data.sizes());
    CHECK(got.scale.sizes() == want.scale.sizes());
    CHECK(at::equal(got.data.view(at::kByte), want.data.view(at::kByte)));
    CHECK(at::equal(got.scale, want.scale));
    if (c.x.dim() == 2 && c.axis == 0) CHECK((got.data.stride(0) == 1 && got.data.stride(1) == c.x.size(0)));
  }
  // A tensorwise G's grad_weight copy: cast with the per-row cast's scale, column-major.
  const Float8Tensor rows = to_float8(x2.to(at::kBFloat16), tensor, -1, false);
  const Float8Tensor cols = cast_to_columns_with_scale(x2.to(at::kBFloat16), rows.scale, tensor.dtype);
  CHECK(cols.data.stride(0) == 1);
  CHECK(at::equal(cols.data.view(at::kByte), rows.data.view(at::kByte)));
  CHECK(at::equal(cols.scale, rows.scale));
}

TEST_CASE("CUDA fused cast kernels equal their CPU references bit for bit", "[float8][cuda]") {
  if (!at::hasCUDA()) return;
  at::manual_seed(13);
  for (at::ScalarType hp : {at::kFloat, at::kBFloat16, at::kHalf}) {
    // 70 x 333: the one-element kernels (and a tail after the last vector of the tensorwise
    // ones); 192 x 128: every kernel's 16-byte path (rows and columns multiples of the vector
    // width and of the 64 x 64 transpose tile).
    at::Tensor x = (at::randn({70, 333}) * 5).to(hp);
    x[5].zero_();
    const at::Tensor y = (at::randn({192, 128}) * 5).to(hp);
    for (at::ScalarType f8 : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (ScalingGranularity g : {ScalingGranularity::Tensorwise, ScalingGranularity::Axiswise}) {
        for (bool pow2 : {false, true}) {
          const CastConfig cfg{g, f8};
          for (const at::Tensor& xc : {x, y}) {
            Float8Tensor ref = fused_cast_rows_reference(xc, cfg, pow2);
            // Also one element off: the 16-byte kernels must fall back to the one-element ones.
            at::Tensor storage = at::empty({xc.numel() + 1}, xc.options().device(at::kCUDA));
            const at::Tensor misaligned = storage.narrow(0, 1, xc.numel()).view(xc.sizes()).copy_(xc);
            for (const at::Tensor& xd : {xc.cuda(), misaligned}) {
              Float8Tensor got = fused_cast_rows_cuda(xd, cfg, pow2);
              CHECK(at::equal(got.scale.cpu(), ref.scale));
              CHECK(at::equal(got.data.cpu().view(at::kByte), ref.data.view(at::kByte)));
            }
            Float8Tensor ref_t = fused_cast_transpose_cols_reference(xc, cfg, pow2);
            for (const at::Tensor& xd : {xc.cuda(), misaligned}) {
              Float8Tensor got_t = fused_cast_transpose_cols_cuda(xd, cfg, pow2);
              CHECK(got_t.data.sizes() == ref_t.data.sizes());
              CHECK(at::equal(got_t.scale.cpu(), ref_t.scale));
              CHECK(at::equal(got_t.data.cpu().view(at::kByte), ref_t.data.view(at::kByte)));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA Float8Linear and Int8Linear match their CPU emulation", "[float8][cuda]") {
  if (!at::hasCUDA()) return;
  for (const std::string& name : recipe_names()) {
    at::manual_seed(14);
    at::Tensor w = at::randn({64, 48}), x = at::randn({2, 32, 48});
    at::Tensor wc = param(w.cuda()), xc = param(x.cuda()), we = param(w), xe = param(x);
    Float8LinearCompute cuda_c(recipe_from_name(name)), emu_c(recipe_from_name(name), true);
    at::Tensor yc = cuda_c.forward(xc, wc), ye = emu_c.forward(xe, we);
    yc.sum().backward();
    ye.sum().backward();
    CHECK(logged("cuda linear " + name, sqnr(ye, yc.cpu())) > 30.0);
    CHECK(sqnr(we.grad(), wc.grad().cpu()) > 30.0);
    CHECK(sqnr(xe.grad(), xc.grad().cpu()) > 30.0);
  }
  at::Tensor a = at::randint(-128, 128, {64, 96}, at::kChar);
  at::Tensor b = at::randint(-128, 128, {96, 32}, at::kChar);
  CHECK(at::equal(int8_mm(a.cuda(), b.cuda(), Int8MmBackend::Auto).cpu(),
                  int8_mm(a, b, Int8MmBackend::Emulated)));
}
#endif
