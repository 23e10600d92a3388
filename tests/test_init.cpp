// The counter-based weight init (Note [Counter-based init] in model/init_philox.h): the
// generator's published test vectors, the transform's accuracy, values pinned by the
// independent numpy implementation (scripts/reference/philox_init.py), shard boxes equal to
// slices of the full parameter, the distributions, the AVX2 filler equal to the scalar one and
// the CUDA twin bit for bit.
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/erfinv.h>
#include <ATen/ops/zeros.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <stdexcept>

#include "model/init_fill.h"
#include "model/init_fill_avx2.h"
#include "model/init_philox.h"
#include "model/transformer.h"

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

namespace {
// Bit patterns, so that a difference in the last bit (or of -0 vs 0) fails.
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}
}  // namespace

// The AVX2 filler (model/init_fill_avx2.cpp) runs on CPUs with AVX2 + FMA, which titan requires
// on x86 (Note [AVX2 kernel files] in the top CMakeLists.txt); elsewhere it is the scalar loop.
TEST_CASE("the AVX2 init filler equals the scalar reference bit for bit", "[model][init]") {
  struct Case {
    const char* name;
    double std, lo, hi;
  };
  const double inf = std::numeric_limits<double>::infinity();
  // torchtitan's three: embedding normal(0, 1); output trunc +-3 std (0.27% of first draws
  // redrawn); a layer's trunc_normal(0.02, +-2 std) here, so that 4.6% are redrawn.
  const Case cases[] = {{"normal", 1.0, -inf, inf}, {"trunc 3 std", 0.125, -0.375, 0.375}, {"trunc 2 std", 0.02, -0.04, 0.04}};
  // (first, n): odd and even starts, ragged lengths around the 8-element groups and the
  // 512-element chunks, block indices past 2^32 (the counter's second word) and near 2^48.
  const std::vector<std::pair<uint64_t, int64_t>> runs = {
      {0, 0}, {0, 1}, {1, 1}, {0, 2}, {1, 2}, {3, 7}, {0, 8}, {1, 8}, {5, 9}, {2, 15}, {7, 16}, {0, 17},
      {11, 511}, {0, 512}, {1, 513}, {1001, 4097}, {(uint64_t{1} << 33) + 3, 1029},
      {(uint64_t{1} << 49) - 2000, 2000}, {12345, 1 << 20}, {(uint64_t{1} << 40) + 1, (1 << 19) + 5}};
  const uint64_t seed = 0x0123456789abcdefULL, key = philox::fqn_hash("layers.3.feed_forward.w2.weight", 31);
  int64_t elements = 0, tails = 0, redrawn = 0;
  std::vector<float> normal_first;
  for (const Case& c : cases) {
    for (auto [first, n] : runs) {
      INFO(c.name << ", elements [" << first << ", " << first + n << ")");
      std::vector<float> scalar(n, 7.0f), vector(n, 7.0f);
      philox::fill_run_scalar(scalar.data(), first, n, seed, key, c.std, c.lo, c.hi);
      philox::fill_run_avx2(vector.data(), first, n, seed, key, c.std, c.lo, c.hi);
      CHECK(first_difference(vector, scalar) == -1);
      elements += n;
      // Coverage: tail draws (|z| > 1.44, AS 241's tail branch) and redrawn first draws
      // (a truncated value differing from the untruncated one with the same std).
      std::vector<float> untruncated(n);
      philox::fill_run_scalar(untruncated.data(), first, n, seed, key, c.std, -inf, inf);
      for (int64_t i = 0; i < n; ++i) {
        tails += std::abs(vector[i] / c.std) > 1.44;
        redrawn += std::memcmp(&vector[i], &untruncated[i], sizeof(float)) != 0;
      }
    }
  }
  CHECK(elements > 4'500'000);
  CHECK(tails > 500'000);   // 15% of draws
  CHECK(redrawn > 20'000);  // 4.6% of the +-2 std case's 1.6 M
  // A box through fill_init_box (the dispatched filler: FSDP rows of a TP column chunk, odd
  // offsets) equals the scalar reference row by row.
  at::Tensor box = at::empty({301, 257}, at::kFloat);
  fill_init_box(box, output_spec(), 9, "output.weight", {1000, 1001}, {333, 77});
  const uint64_t out_key = philox::fqn_hash("output.weight", 13);
  for (int64_t r = 0; r < 301; ++r) {
    std::vector<float> row(257), expect(257);
    std::memcpy(row.data(), box[r].data_ptr<float>(), 257 * sizeof(float));
    philox::fill_run_scalar(expect.data(), (333 + r) * 1001 + 77, 257, 9, out_key, 0.125, -0.375, 0.375);
    INFO("row " << r);
    REQUIRE(same_bits(row, expect));
  }
}

TEST_CASE("the AVX2 normal quantile equals the scalar one in every branch", "[model][init]") {
  // Central (|u - 0.5| <= 0.425), tail (r = sqrt(-log r) <= 5) and far tail (r > 5: u below
  // 1.4e-11, which the fillers above never draw) on both sides, down to the extreme uniforms
  // 2^-53 and 1 - 2^-53; ragged counts (the vector's last 1-3 lanes padded).
  std::vector<double> p;
  for (int i = 1; i < 20000; ++i) p.push_back(i / 20000.0);
  for (double u = 0x1p-53; u < 0.5; u *= 1.001) {
    p.push_back(u);
    p.push_back(1.0 - u);  // rounded, still below 1
  }
  for (uint64_t k = 0; k < 64; ++k) {
    p.push_back((2 * k + 1) * 0x1p-53);
    p.push_back(1.0 - (2 * k + 1) * 0x1p-53);
  }
  // The filler's own uniforms (2^20 of them): a one-ulp change of a float64 step mostly
  // vanishes in float(std * z), so the quantile is compared in float64 here, densely.
  for (uint32_t block = 0; block < (1u << 19); ++block) {
    const philox::Words w = philox::philox4x32_10(block, 0, 0x9e3779b9u, 0x7f4a7c15u, 17, 0);
    p.push_back(philox::uniform_of(w.v[0], w.v[1]));
    p.push_back(philox::uniform_of(w.v[2], w.v[3]));
  }
  for (double edge : {0.075, 0.925, 0.075 + 0x1p-53, 0.925 - 0x1p-53, std::exp(-25.0)}) p.push_back(edge);
  int64_t far = 0;
  for (double u : p) far += std::min(u, 1.0 - u) < std::exp(-25.0);
  CHECK(far > 100);
  for (size_t n : {p.size(), p.size() - 1, size_t{3}}) {
    std::vector<double> scalar(n), vector(n);
    for (size_t i = 0; i < n; ++i) scalar[i] = philox::normal_quantile(p[i]);
    philox::normal_quantile_avx2(p.data(), vector.data(), static_cast<int64_t>(n));
    size_t differ = 0;
    for (size_t i = 0; i < n; ++i) differ += std::memcmp(&scalar[i], &vector[i], sizeof(double)) != 0;
    INFO(n << " values");
    CHECK(differ == 0);
  }
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
