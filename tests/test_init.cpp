// The counter-based weight init (Note [Counter-based init] in model/init_philox.h): the
// generator's published test vectors, the transform's accuracy, values pinned by the
// independent numpy implementation (scripts/reference/philox_init.py), shard boxes equal to
// slices of the full parameter, the distributions, and the CUDA twin bit for bit.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/erfinv.h>
#include <ATen/ops/zeros.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "model/init_fill.h"
#include "model/init_philox.h"
#include "model/llama.h"

namespace philox = titan::model::philox;
using titan::model::fill_init_box;
using titan::model::InitSpec;

namespace {
at::Tensor full_values(const InitSpec& spec, uint64_t seed, const std::string& fqn,
                       std::vector<int64_t> shape) {
  at::Tensor t = at::empty(shape, at::kFloat);
  fill_init_box(t, spec, seed, fqn, shape, std::vector<int64_t>(shape.size(), 0));
  return t;
}
InitSpec output_spec() {  // trunc_normal_(std 0.125, a = -3 std, b = 3 std), as for dim 64
  InitSpec s;
  s.std = 0.125;
  s.lo = -0.375;
  s.hi = 0.375;
  return s;
}
}  // namespace

TEST_CASE("Philox-4x32-10 matches Random123's known-answer vectors; FNV-1a 64", "[model][init]") {
  auto check = [](philox::Words w, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    CHECK(w.v[0] == a);
    CHECK(w.v[1] == b);
    CHECK(w.v[2] == c);
    CHECK(w.v[3] == d);
  };
  check(philox::philox4x32_10(0, 0, 0, 0, 0, 0), 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  const uint32_t f = 0xffffffff;
  check(philox::philox4x32_10(f, f, f, f, f, f), 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  check(philox::philox4x32_10(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822,
                              0x299f31d0),
        0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
  CHECK(philox::fqn_hash("", 0) == 0xcbf29ce484222325ULL);
  CHECK(philox::fqn_hash("output.weight", 13) == 0x6d1cf81ef83b28c6ULL);
}

TEST_CASE("log and the normal quantile are float64-accurate with + - * / sqrt only", "[model][init]") {
  // The own log agrees with libm's to a few ulp: 4e-16 relative covers the series' truncation
  // (< 1e-18) plus the rounding of ~25 operations.
  double worst_log = 0;
  for (double x = 1e-17; x < 1.0; x *= 1.0137)
    worst_log = std::max(worst_log, std::abs(philox::log_positive(x) - std::log(x)) / -std::log(x));
  CHECK(worst_log < 4e-16);
  // AS 241 is accurate to about 1e-16 relative; the erfinv-based comparison value carries its
  // own float64 rounding (~1e-15 near the centre where z is small), hence 3e-15.
  double worst_q = 0;
  for (int i = 1; i < 2000; ++i) {
    const double p = i / 2000.0;
    const double z = std::sqrt(2.0) * at::erfinv(at::scalar_tensor(2 * p - 1, at::kDouble)).item<double>();
    worst_q = std::max(worst_q, std::abs(philox::normal_quantile(p) - z) / std::max(std::abs(z), 1e-3));
  }
  CHECK(worst_q < 3e-15);
  CHECK(philox::normal_quantile(0.5) == 0.0);
  CHECK(philox::normal_quantile(1e-300) < -37.0);  // far tail, finite
}

TEST_CASE("init values equal the independent numpy implementation bit for bit", "[model][init]") {
  // From scripts/reference/philox_init.py (init_values(7, "output.weight", (40, 64), 0.125,
  // -0.375, 0.375) and init_values(123456789012345, "tok_embeddings.weight", (3,), 1.0)).
  const at::Tensor out = full_values(output_spec(), 7, "output.weight", {40, 64}).view(-1);
  CHECK(out[0].item<float>() == 0x1.0bfa86p-3f);
  CHECK(out[1].item<float>() == 0x1.57d7e4p-2f);
  CHECK(out[2].item<float>() == -0x1.d86ee4p-9f);
  CHECK(out[3].item<float>() == -0x1.acc364p-9f);
  CHECK(out[2558].item<float>() == -0x1.8f59fcp-6f);
  CHECK(out[2559].item<float>() == 0x1.629acep-4f);
  // Element 55's first draw is beyond 3 std: its value is the second attempt's.
  CHECK(out[55].item<float>() == 0x1.45e4b6p-3f);
  const at::Tensor emb = full_values(InitSpec{}, 123456789012345ULL, "tok_embeddings.weight", {3});
  CHECK(emb[0].item<float>() == -0x1.0b1f62p+0f);
  CHECK(emb[1].item<float>() == -0x1.23375ap-1f);
  CHECK(emb[2].item<float>() == 0x1.2a99a0p-1f);
}

TEST_CASE("a box of a parameter equals that slice of the full parameter", "[model][init]") {
  const at::Tensor full = full_values(output_spec(), 3, "output.weight", {37, 29});
  // Odd offsets and extents: FSDP rows of a TP column chunk, element index parity both ways.
  for (auto [r0, c0, rows, cols] : std::vector<std::array<int64_t, 4>>{
           {0, 0, 37, 29}, {5, 3, 7, 11}, {36, 28, 1, 1}, {13, 0, 0, 29}, {1, 14, 36, 15}}) {
    at::Tensor box = at::zeros({rows, cols}, at::kFloat);
    fill_init_box(box, output_spec(), 3, "output.weight", {37, 29}, {r0, c0});
    INFO("box at " << r0 << "," << c0 << " of " << rows << "x" << cols);
    CHECK(at::equal(box, full.narrow(0, r0, rows).narrow(1, c0, cols)));
  }
  // Into a non-contiguous float64 view (a column chunk of a bigger tensor), 1-D too.
  at::Tensor wide = at::zeros({37, 40}, at::kDouble);
  fill_init_box(wide.narrow(1, 0, 29), output_spec(), 3, "output.weight", {37, 29}, {0, 0});
  CHECK(at::equal(wide.narrow(1, 0, 29).to(at::kFloat), full));
  const at::Tensor vec = full_values(InitSpec{}, 3, "v", {101});
  at::Tensor tail = at::empty({50}, at::kFloat);
  fill_init_box(tail, InitSpec{}, 3, "v", {101}, {51});
  CHECK(at::equal(tail, vec.narrow(0, 51, 50)));
  // Seed and name both select the stream.
  CHECK_FALSE(at::equal(full, full_values(output_spec(), 4, "output.weight", {37, 29})));
  CHECK_FALSE(at::equal(full, full_values(output_spec(), 3, "output.weigh", {37, 29})));
  // An empty box (an FSDP shard of padding only, which starts past the last row) is no error.
  at::Tensor none = at::empty({0, 29}, at::kFloat);
  fill_init_box(none, output_spec(), 3, "output.weight", {37, 29}, {40, 0});
  // A box outside the parameter is one error naming it.
  at::Tensor bad = at::empty({8, 4}, at::kFloat);
  CHECK_THROWS_WITH(fill_init_box(bad, output_spec(), 3, "output.weight", {37, 29}, {30, 0}),
                    Catch::Contains("'output.weight'") && Catch::Contains("does not fit"));
}

TEST_CASE("init distributions: normal, truncated normal, ones", "[model][init]") {
  const at::Tensor n = full_values(InitSpec{}, 11, "tok_embeddings.weight", {512, 512});
  // 262,144 samples: the mean's standard error is 0.002, the std's 0.0014; bounds at ~5 sigma.
  CHECK(std::abs(n.mean().item<double>()) < 0.01);
  CHECK(n.std().item<double>() == Approx(1.0).margin(0.007));
  // P(|z| > 4) = 6.3e-5: ~17 expected; the tails are there (no truncation of plain normal_).
  CHECK(n.abs().gt(4).sum().item<int64_t>() > 3);
  const at::Tensor t = full_values(output_spec(), 11, "output.weight", {512, 512});
  CHECK(t.abs().max().item<double>() <= 0.375);
  // A normal truncated at +-3 std has std 0.98658 * std = 0.12332 (standard error 0.0002).
  CHECK(t.std().item<double>() == Approx(0.98658 * 0.125).margin(0.001));
  InitSpec ones;
  ones.ones = true;
  CHECK(full_values(ones, 1, "norm.weight", {9}).eq(1).all().item<bool>());
}

TEST_CASE("CUDA init twin equals the CPU bit for bit", "[model][init][cuda]") {
  REQUIRE(titan::model::init_cuda_available());
  const auto cuda = at::TensorOptions().dtype(at::kFloat).device(c10::kCUDA);
  for (const InitSpec& spec : {InitSpec{}, output_spec()}) {
    // 3.3M elements: every branch of the quantile (central, tail, far tail) and rejections.
    const at::Tensor cpu = full_values(spec, 5, "layers.0.attention.wq.weight", {1811, 1833});
    at::Tensor gpu = at::empty({1811, 1833}, cuda);
    fill_init_box(gpu, spec, 5, "layers.0.attention.wq.weight", {1811, 1833}, {0, 0});
    CHECK(at::equal(gpu.cpu(), cpu));
    at::Tensor box = at::empty({100, 77}, cuda.dtype(at::kBFloat16));
    fill_init_box(box, spec, 5, "layers.0.attention.wq.weight", {1811, 1833}, {1701, 1001});
    CHECK(at::equal(box.cpu(), cpu.narrow(0, 1701, 100).narrow(1, 1001, 77).to(at::kBFloat16)));
  }
}
