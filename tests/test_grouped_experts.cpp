// Low-precision MoE experts on the CPU (float8/grouped_experts.h): each expert recipe's grouped
// projection, forward and backward, against torchao 0.18 (scripts/reference/grouped_experts_
// reference.py: its rowwise quantizers, its emulated MXFP8 grouped GEMM) on uneven groups with an
// empty one, padded as torchtitan pads them on torchao's side and not at all on titan's; blockwise
// (which torchao runs only through Triton) against a float64 product; and the grouped SwiGLU
// experts equal to each expert's own dense low-precision linears, bit for bit.
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "float8/grouped_experts.h"
#include "float8/recipe.h"
#include "float8/scaling.h"
#include "model/linear.h"
#include "model/moe/moe.h"
#include "tests/torchao_reference.h"

using namespace titan;
using titan_test::bytes;
using titan_test::same_bits;
using titan_test::sqnr;

namespace {

const std::map<std::string, at::Tensor>* reference() { return titan_test::torchao_reference("grouped_experts_reference.py"); }
const at::Tensor& expected(const std::string& name) { return titan_test::reference_tensor(*reference(), name); }

std::vector<int64_t> counts_of(const std::string& group_case) {
  const at::Tensor c = expected(group_case + "/counts");
  std::vector<int64_t> out;
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(static_cast<int64_t>(c[i].item<float>()));
  return out;
}

// max |a - b| / max |ref|: the error of the largest element's scale.
double max_relative(const at::Tensor& ref, const at::Tensor& actual) {
  const at::Tensor r = ref.to(at::kDouble), a = actual.detach().to(at::kDouble);
  return (r - a).abs().max().item<double>() / r.abs().max().item<double>();
}

float8::ExpertRecipe recipe(const std::string& name) {
  if (name == "rowwise" || name == float8::kBlockwiseRecipeName) return {"float8", name, true};
  return {"mx", name, true};
}

at::Tensor normal(std::vector<int64_t> shape, uint64_t seed, double scale = 1.0) {
  at::manual_seed(seed);
  return at::randn(shape) * scale;
}

}  // namespace

TEST_CASE("float8 rowwise experts cast every operand along torchao's axes: per row, per expert column, per group column",
          "[float8][grouped]") {
  REQUIRE_TORCHAO_REFERENCE(reference());
  const float8::Float8Recipe r = float8::recipe_from_name("rowwise");
  for (const std::string group_case : {"uneven", "aligned"})
    for (const std::string dtype : {"f32", "bf16"}) {
      const std::string base = group_case + "/" + dtype, key = base + "/rowwise";
      INFO(key);
      const std::vector<int64_t> counts = counts_of(group_case);
      const at::Tensor A = expected(base + "/A"), W = expected(base + "/W"), G = expected(base + "/G");
      const int64_t K = A.size(1), N = G.size(1);
      for (int64_t e = 0; e < W.size(0); ++e) {
        // The dense rowwise linear's casts of one expert's weight W[e] [N, K]: per row for the
        // output GEMM (torchao: B = W^T per column, over K), per column for grad_input (torchao's
        // 3-D transpose rhs: per row of B^T, over N).
        const float8::Float8Tensor fwd = float8::to_float8(W[e], r.weight, -1, true);
        CHECK(same_bits(bytes(fwd.data), expected(key + "/w_fwd_data")[e]));
        CHECK(same_bits(fwd.scale, expected(key + "/w_fwd_scale")[e]));
        const float8::Float8Tensor dgrad = float8::to_float8(W[e], r.weight_for_grad_input, 0, true);
        CHECK(same_bits(bytes(dgrad.data), expected(key + "/w_dgrad_data")[e]));
        CHECK(same_bits(dgrad.scale, expected(key + "/w_dgrad_scale")[e]));
      }
      // grad_weight = G_e^T A_e: both scaled per column within the group (torchao's per-group
      // colwise scales; its scale vector lists the non-empty groups' columns one group after another).
      int64_t start = 0, group = 0;
      for (int64_t rows : counts) {
        if (rows > 0) {
          const float8::Float8Tensor g = float8::to_float8(G.narrow(0, start, rows), r.grad_output, 0, true);
          const float8::Float8Tensor a = float8::to_float8(A.narrow(0, start, rows), r.input, 0, true);
          CHECK(same_bits(bytes(g.data), expected(key + "/g_colwise_data").narrow(0, start, rows)));
          CHECK(same_bits(g.scale.reshape({-1}), expected(key + "/g_colwise_scale").narrow(0, group * N, N)));
          CHECK(same_bits(bytes(a.data), expected(key + "/a_colwise_data").narrow(0, start, rows)));
          CHECK(same_bits(a.scale.reshape({-1}), expected(key + "/a_colwise_scale").narrow(0, group * K, K)));
          ++group;
        }
        start += rows;
      }
    }
}

TEST_CASE("each expert recipe's grouped projection equals torchao's, forward and backward, on uneven, empty and "
          "aligned groups",
          "[float8][grouped]") {
  REQUIRE_TORCHAO_REFERENCE(reference());
  titan_test::OneThread one;
  struct Case {
    std::string recipe, dtype;
  };
  for (const std::string group_case : {"uneven", "aligned"})
    for (const Case& c : {Case{"rowwise", "f32"}, Case{"rowwise", "bf16"}, Case{"mxfp8_rceil", "bf16"},
                          Case{"mxfp8_floor", "bf16"}}) {
      const std::string base = group_case + "/" + c.dtype, key = base + "/" + c.recipe;
      INFO(key);
      const std::vector<int64_t> counts = counts_of(group_case);
      at::Tensor x = expected(base + "/A").clone().requires_grad_(true);
      at::Tensor w = expected(base + "/W").clone().requires_grad_(true);
      const model::moe::ExpertComputes computes = float8::expert_computes(recipe(c.recipe));
      const at::Tensor y = model::moe::grouped_linear(x, w, counts, *computes.w1, computes.group_alignment);
      y.backward(expected(base + "/G"));
      const at::Tensor* got[] = {&y, &x.grad(), &w.grad()};
      const char* names[] = {"out", "grad_input", "grad_weight"};
      for (int i = 0; i < 3; ++i) {
        const at::Tensor& want = expected(key + "/" + names[i]);
        INFO(names[i] << ": max relative difference " << max_relative(want, *got[i]));
        if (std::getenv("TITAN_F8_VERBOSE"))
          std::cout << key << " " << names[i] << ": max relative difference " << max_relative(want, *got[i]) << "\n";
        if (c.recipe != "rowwise") {
          // MXFP8: the same E8M0 blocks and e4m3 bytes as torchao's emulation, dequantized into
          // bfloat16 exactly and multiplied by one bfloat16 GEMM each: the same bits.
          CHECK(same_bits(*got[i], want));
        } else if (c.dtype == "f32") {
          // The same float8 operands (checked bitwise above); titan sums their products in float32
          // where the reference sums in float64: K = 64 (96, 37 for the weight gradient) terms, each
          // sum off by at most ~K 2^-24 of its magnitude: 1e-5 of the largest.
          CHECK(max_relative(want, *got[i]) <= 1e-5);
        } else {
          // bfloat16 output: one rounding of the float32 (titan) or float64 (reference) sum, which
          // differ by the float32 error above: at most one bfloat16 step (2^-8) of the largest.
          CHECK(max_relative(want, *got[i]) <= std::ldexp(1.0, -8));
        }
      }
    }
}

TEST_CASE("blockwise float8 experts: the grouped projection within e4m3's SQNR of a float64 product, and exact for "
          "an empty group",
          "[float8][grouped]") {
  // torchao runs its blockwise grouped GEMM only through Triton kernels, so the reference is the
  // float64 product of the high-precision operands. e4m3 keeps 3 mantissa bits: round to nearest
  // gives each quantized operand an error of at most 2^-4 relative, rms about 2^-3 / sqrt(12) of
  // its binade (~29 dB over normal values), and a product of two such operands ~26 dB; 25 dB is
  // that bound less the tiles' partial blocks' coarser scales (measured 28-29 dB).
  const std::vector<int64_t> counts = {5, 0, 37, 22};
  const int64_t E = 4, K = 64, N = 96, T = 64;
  at::Tensor x = normal({T, K}, 11).requires_grad_(true);
  at::Tensor w = normal({E, N, K}, 12, 0.05).requires_grad_(true);
  const at::Tensor g = normal({T, N}, 13, 1e-3);
  const model::moe::ExpertComputes computes = float8::expert_computes(recipe(float8::kBlockwiseRecipeName));
  const at::Tensor y = model::moe::grouped_linear(x, w, counts, *computes.w1);
  y.backward(g);
  at::Tensor x64 = x.detach().to(at::kDouble).requires_grad_(true), w64 = w.detach().to(at::kDouble).requires_grad_(true);
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (int64_t e = 0; e < E; ++e) {
    parts.push_back(x64.narrow(0, start, counts[e]).matmul(w64[e].t()));
    start += counts[e];
  }
  const at::Tensor y64 = at::cat(parts, 0);
  y64.backward(g.to(at::kDouble));
  if (std::getenv("TITAN_F8_VERBOSE"))
    std::cout << "blockwise grouped SQNR: out " << sqnr(y64, y) << " dB, grad_input " << sqnr(x64.grad(), x.grad())
              << " dB, grad_weight[2] " << sqnr(w64.grad()[2], w.grad()[2]) << " dB\n";
  CHECK(sqnr(y64, y) >= 25.0);
  CHECK(sqnr(x64.grad(), x.grad()) >= 25.0);
  for (int64_t e : {0, 2, 3}) CHECK(sqnr(w64.grad()[e], w.grad()[e]) >= 25.0);
  CHECK(w.grad()[1].abs().max().item<float>() == 0.0f);  // expert 1 had no tokens
}

TEST_CASE("grouped low-precision experts equal each expert's dense low-precision linears, bit for bit",
          "[float8][grouped]") {
  // The definition of an expert recipe (Note [Low-precision experts] in model/moe/moe.h): the
  // dense linears' recipe on each group. Dense linears of the same recipe, one set per expert, run
  // the same SwiGLU on the expert's rows; every output row and every gradient must match.
  const std::vector<int64_t> counts = {5, 0, 37, 22};
  const int64_t E = 4, D = 64, H = 96, T = 64;
  for (const std::string name : {"rowwise", "blockwise", "mxfp8", "mxfp8_floor"}) {
    INFO(name);
    at::Tensor x = normal({T, D}, 21).requires_grad_(true);
    at::Tensor w1 = normal({E, H, D}, 22, 0.1).requires_grad_(true), w3 = normal({E, H, D}, 23, 0.1).requires_grad_(true);
    at::Tensor w2 = normal({E, D, H}, 24, 0.1).requires_grad_(true);
    const at::Tensor g = normal({T, D}, 25, 1e-2);
    const model::moe::ExpertComputes computes = float8::expert_computes(recipe(name));
    const at::Tensor y = model::moe::grouped_experts(x, w1, w2, w3, counts, computes);
    y.backward(g);
    int64_t start = 0;
    for (int64_t e = 0; e < E; ++e) {
      INFO("expert " << e << " with " << counts[e] << " rows");
      if (counts[e] == 0) {
        CHECK(w1.grad()[e].abs().max().item<float>() == 0.0f);
        CHECK(w2.grad()[e].abs().max().item<float>() == 0.0f);
        continue;
      }
      const model::moe::ExpertComputes dense = float8::expert_computes(recipe(name));
      at::Tensor xe = x.detach().narrow(0, start, counts[e]).clone().requires_grad_(true);
      at::Tensor a = w1.detach()[e].clone().requires_grad_(true), b = w2.detach()[e].clone().requires_grad_(true),
                 c = w3.detach()[e].clone().requires_grad_(true);
      // The dense linears see the group padded with zero rows to the recipe's alignment, as
      // torchtitan hands its groups to torchao (MX: 32 rows).
      const int64_t pad = (dense.group_alignment - counts[e] % dense.group_alignment) % dense.group_alignment;
      const at::Tensor xp = at::constant_pad_nd(xe, {0, 0, 0, pad});
      const at::Tensor ye =
          dense.w2->forward(at::silu(dense.w1->forward(xp, a)) * dense.w3->forward(xp, c), b).narrow(0, 0, counts[e]);
      ye.backward(g.narrow(0, start, counts[e]));
      CHECK(same_bits(ye, y.detach().narrow(0, start, counts[e])));
      CHECK(same_bits(xe.grad(), x.grad().narrow(0, start, counts[e])));
      CHECK(same_bits(a.grad(), w1.grad()[e]));
      CHECK(same_bits(b.grad(), w2.grad()[e]));
      CHECK(same_bits(c.grad(), w3.grad()[e]));
      start += counts[e];
    }
  }
}

TEST_CASE("expert conversion: fqns select MoE layers as torchtitan's filter does; bad names and shapes are refused",
          "[float8][grouped]") {
  model::moe::MoEArgs args;
  args.num_experts = 4;
  args.top_k = 2;
  model::moe::MoE a("layers.1.moe", args, 64, 96), b("layers.12.moe", args, 64, 96);
  const std::vector<model::moe::MoE*> layers = {&a, &b};
  const float8::ExpertRecipe rowwise{"float8", "rowwise", true};
  const auto report = float8::convert_experts(layers, {"layers.1."}, rowwise, "quantize.grouped_mm.float8.fqns");
  REQUIRE(report.converted.size() == 1);
  CHECK(report.converted[0].first == "layers.1.moe.experts");
  CHECK(a.expert_computes.defined());
  CHECK_FALSE(b.expert_computes.defined());
  CHECK(float8::convert_experts(layers, {"experts"}, rowwise, "k").converted.size() == 2);
  CHECK_THROWS_WITH(float8::convert_experts(layers, {"shared_experts"}, rowwise, "quantize.grouped_mm.float8.fqns"),
                    Catch::Contains("quantize.grouped_mm.float8.fqns entry 'shared_experts' names no MoE module") &&
                        Catch::Contains("layers.1.moe.experts, layers.12.moe.experts"));
  CHECK_THROWS_WITH(float8::convert_experts(layers, {}, rowwise, "quantize.grouped_mm.float8.fqns"),
                    Catch::Contains("is empty"));
  CHECK_THROWS_WITH(float8::convert_experts({}, {"experts"}, rowwise, "k"), Catch::Contains("no mixture-of-experts layer"));
  model::moe::MoE odd("layers.0.moe", args, 64, 40);  // 40 % 32 != 0: no MX block fits
  CHECK_THROWS_WITH(float8::convert_experts({&odd}, {"experts"}, {"mx", "mxfp8", true}, "k"),
                    Catch::Contains("hidden dim 40") && Catch::Contains("divisible by 32"));
  CHECK_THROWS_WITH(float8::expert_computes({"float8", "tensorwise", true}), Catch::Contains("rowwise, blockwise"));
  CHECK(float8::token_group_alignment(rowwise) == 16);
  CHECK(float8::expert_gemm_unavailable(rowwise, c10::Device(c10::kCPU)).empty());  // the CPU always emulates
  CHECK(float8::token_group_alignment({"mx", "mxfp8", true}) == 32);
  // Under tensor parallelism the hidden shard must hold whole blocks.
  model::moe::MoE tp("layers.0.moe", args, 64, 64);
  float8::convert_experts({&tp}, {"experts"}, {"mx", "mxfp8", true}, "k");
  CHECK_NOTHROW(float8::expert_computes_under_tp(tp, 2, [](at::Tensor&) {}));
  CHECK_THROWS_WITH(float8::expert_computes_under_tp(tp, 4, [](at::Tensor&) {}), Catch::Contains("block of 32"));
}
