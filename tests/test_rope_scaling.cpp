// Llama 3.1 RoPE scaling against the published formula (Meta's `apply_scaling`, torchtitan's
// precompute_freqs_cis), written out here independently of model/args.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "model/flavors.h"
#include "model/transformer.h"

using namespace titan::model;

namespace {

// The published piecewise rule, for factor 8, low 1, high 4, original context 8192.
double published_scaled_freq(double freq) {
  const double factor = 8, low = 1, high = 4, original = 8192;
  const double wavelen = 2 * M_PI / freq;
  if (wavelen < original / high) return freq;
  if (wavelen > original / low) return freq / factor;
  const double smooth = (original / wavelen - low) / (high - low);
  return (1 - smooth) * freq / factor + smooth * freq;
}

}  // namespace

TEST_CASE("torchtitan's flavors scale RoPE as Llama 3.1", "[model][rope]") {
  for (const std::string name : {"debugmodel", "8B", "70B", "405B", "8B_4layers"}) {
    INFO(name);
    const RopeScaling s = model_flavor("llama3", name).rope_scaling;
    CHECK(s.enabled);
    CHECK(s.factor == 8.0);
    CHECK(s.low_freq_factor == 1.0);
    CHECK(s.high_freq_factor == 4.0);
    CHECK(s.original_max_position_embeddings == 8192);
  }
  CHECK_FALSE(model_flavor("llama3", "100M").rope_scaling.enabled);  // titan's benchmark model
  CHECK_FALSE(ModelArgs{}.rope_scaling.enabled);
}

TEST_CASE("the RoPE table follows the published scaling formula", "[model][rope]") {
  const ModelArgs args = model_flavor("llama3", "8B");
  const int64_t hd = args.head_dim(), seq = 64;
  REQUIRE(hd == 128);
  const RotaryTable table =
      make_rotary_table(hd, seq, args.rope_theta, c10::kCPU, args.rope_scaling);
  const RotaryTable plain = make_rotary_table(hd, seq, args.rope_theta, c10::kCPU);
  int high = 0, low = 0, medium = 0;
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double freq = std::pow(args.rope_theta, -2.0 * i / hd);
    const double scaled = published_scaled_freq(freq);
    high += scaled == freq;
    low += scaled == freq / 8;
    medium += scaled != freq && scaled != freq / 8;
    for (const int64_t pos : {int64_t{1}, int64_t{17}, seq - 1}) {
      // The table stores float32 cos/sin of float64 angles: within float32's half-ulp of 1
      // (6e-8) plus the float64 rounding of the angle (~1e-14).
      CHECK(table.cos[pos][i].item<double>() == Approx(std::cos(pos * scaled)).margin(1e-7));
      CHECK(table.sin[pos][i].item<double>() == Approx(std::sin(pos * scaled)).margin(1e-7));
    }
  }
  // theta = 500000, head_dim 128: wavelengths below 2048 (i < 29) keep their frequency, those
  // above 8192 (i >= 35) are divided by 8, the 6 between are interpolated.
  CHECK(high == 29);
  CHECK(medium == 6);
  CHECK(low == 29);
  // Unscaled high frequencies give the same table as no scaling at all.
  CHECK(table.cos.narrow(1, 0, 29).equal(plain.cos.narrow(1, 0, 29)));
  CHECK_FALSE(table.cos.narrow(1, 40, 1).equal(plain.cos.narrow(1, 40, 1)));
}
