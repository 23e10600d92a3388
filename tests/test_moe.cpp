// The mixture-of-experts layer (model/moe/moe.h) against a plain per-token reference in float64:
// for each token its own router scores, choice, weights and the sum over its chosen experts,
// written from torchtitan 0.2.2's definition (Note [MoE forward]) without any reordering,
// histogram or batching. Forward and backward, for every MoEArgs switch.
//
// Tolerance: the layer runs in float32 (its router always does), the reference in float64.
// Every output is a short chain (the gate's 16-term dot products, a softmax or sigmoid over 8
// experts, two 16-term and one 12-term dot product per expert, a sum over <= 2 choices and the
// shared expert), so float32 rounding (u = 6e-8) accumulates to well under 100 u relative to the
// largest value: the bound is 1e-5 of each tensor's largest reference value (measured: up to 1.0e-6; a
// wrong choice, weight or permutation is off by O(1)).
#include <ATen/ops/abs.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "model/moe/moe.h"
#include "tests/sin_values.h"

using namespace titan::model::moe;
using Catch::Matchers::Contains;

namespace {

// The layer's SwiGLU experts (every MoE layer built without a family's own experts has them).
titan::model::moe::SwiGluExperts& swiglu(titan::model::moe::MoE& layer) {
  return dynamic_cast<titan::model::moe::SwiGluExperts&>(*layer.experts);
}

constexpr int64_t kDim = 16, kHidden = 12, kExperts = 8;

// The layer's parameters, float64 leaves (the reference) and their float32 copies (the layer).
struct Params {
  std::map<std::string, at::Tensor> f64;
};

Params make_params(const MoEArgs& args, uint64_t seed) {
  at::manual_seed(seed);
  Params p;
  auto make = [&](const std::string& name, std::vector<int64_t> shape, double scale) {
    p.f64[name] = (at::randn(shape, at::kDouble) * scale).requires_grad_(true);
  };
  make("gate", {kExperts, kDim}, 0.5);
  if (args.gate_bias) make("gate_bias", {kExperts}, 0.5);
  make("w1", {kExperts, kHidden, kDim}, 0.3);
  make("w2", {kExperts, kDim, kHidden}, 0.3);
  make("w3", {kExperts, kHidden, kDim}, 0.3);
  if (args.num_shared_experts > 0) {
    const int64_t h = kHidden * args.num_shared_experts;
    make("shared_w1", {h, kDim}, 0.3);
    make("shared_w2", {kDim, h}, 0.3);
    make("shared_w3", {h, kDim}, 0.3);
  }
  return p;
}

at::Tensor swiglu(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  const at::Tensor g = x.matmul(w1.t());
  return (g * at::sigmoid(g) * x.matmul(w3.t())).matmul(w2.t());
}

struct Reference {
  at::Tensor out;                 // [N, D] float64
  std::vector<int64_t> counts;    // tokens per expert
};

// Token by token, as Note [MoE forward] defines it.
Reference reference(const at::Tensor& x /* [N, D] float64 */, const Params& p, const MoEArgs& a,
                    const at::Tensor& expert_bias /* [E] float64 or undefined */) {
  const int64_t N = x.size(0), E = a.num_experts, K = a.top_k;
  std::vector<at::Tensor> rows;
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int64_t t = 0; t < N; ++t) {
    const at::Tensor xt = x.select(0, t);
    at::Tensor logits = p.f64.at("gate").matmul(xt);
    if (a.gate_bias) logits = logits + p.f64.at("gate_bias");
    const at::Tensor scores = a.score_func == "sigmoid" ? at::sigmoid(logits) : at::softmax(logits, 0);
    std::vector<double> choice(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      choice[e] = scores[e].item<double>() + (expert_bias.defined() ? expert_bias[e].item<double>() : 0.0);
    if (a.num_expert_groups) {
      const int64_t G = *a.num_expert_groups, per = E / G;
      std::vector<std::pair<double, int64_t>> groups;
      for (int64_t g = 0; g < G; ++g) {
        std::vector<double> members(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(members.rbegin(), members.rend());
        groups.push_back({members[0] + members[1], g});
      }
      std::sort(groups.rbegin(), groups.rend());
      for (size_t i = static_cast<size_t>(*a.num_limited_groups); i < groups.size(); ++i)
        for (int64_t e = groups[i].second * per; e < (groups[i].second + 1) * per; ++e)
          choice[e] = -std::numeric_limits<double>::infinity();
    }
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return choice[i] > choice[j]; });
    std::vector<int64_t> chosen(order.begin(), order.begin() + K);
    if (a.force_load_balance)
      for (int64_t j = 0; j < K; ++j) chosen[j] = (t * K + j) % E;
    std::vector<at::Tensor> weights;
    for (int64_t e : chosen) weights.push_back(scores[e]);
    at::Tensor total = at::zeros({}, at::kDouble);
    for (const auto& w : weights) total = total + w;
    at::Tensor out = at::zeros({x.size(1)}, at::kDouble);
    for (int64_t j = 0; j < K; ++j) {
      at::Tensor w = weights[j];
      if (a.route_norm) w = w / (total + 1e-20);
      w = w * a.route_scale;
      const int64_t e = chosen[j];
      ++counts[e];
      auto expert = [&](const at::Tensor& in) {
        return swiglu(in.unsqueeze(0), p.f64.at("w1")[e], p.f64.at("w2")[e], p.f64.at("w3")[e]).squeeze(0);
      };
      out = out + (a.score_before_experts ? expert(xt * w) : w * expert(xt));
    }
    if (a.num_shared_experts > 0)
      out = out + swiglu(xt.unsqueeze(0), p.f64.at("shared_w1"), p.f64.at("shared_w2"), p.f64.at("shared_w3")).squeeze(0);
    rows.push_back(out);
  }
  return {at::stack(rows), counts};
}

double worst(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(at::kDouble) - want).abs().max().item<double>() / want.abs().max().item<double>();
}

}  // namespace

TEST_CASE("MoE layer equals a per-token float64 reference, forward and backward, for every switch",
          "[model][moe]") {
  struct Case {
    const char* name;
    MoEArgs args;
  };
  std::vector<Case> cases;
  {
    MoEArgs a;  // torchtitan's defaults: sigmoid, top 1, one shared expert, score before experts
    a.num_experts = kExperts;
    cases.push_back({"defaults with a load-balancing bias", a});
    MoEArgs q = a;  // Qwen3-MoE: softmax, top 2, route_norm, no shared expert, score after
    q.score_func = "softmax";
    q.top_k = 2;
    q.route_norm = true;
    q.num_shared_experts = 0;
    q.score_before_experts = false;
    q.load_balance_coeff.reset();
    cases.push_back({"qwen3-moe (softmax, top 2, route_norm, score after)", q});
    MoEArgs d = a;  // DeepSeek-V3-like: groups, gate bias, route scale, two shared experts
    d.top_k = 2;
    d.num_expert_groups = 4;
    d.num_limited_groups = 2;
    d.route_norm = true;
    d.route_scale = 2.5;
    d.gate_bias = true;
    d.num_shared_experts = 2;
    d.score_before_experts = false;
    cases.push_back({"group-limited routing, gate bias, route scale, 2 shared", d});
    MoEArgs f = q;
    f.force_load_balance = true;
    f.score_before_experts = true;
    cases.push_back({"debug force-load-balance (round robin)", f});
  }
  for (const Case& c : cases) {
    INFO(c.name);
    const MoEArgs& a = c.args;
    const Params p = make_params(a, 11);
    MoE layer("layers.1.moe", a, kDim, kHidden);
    auto f32 = [&](const std::string& name) { return p.f64.at(name).detach().to(at::kFloat).requires_grad_(true); };
    layer.gate.weight = f32("gate");
    if (a.gate_bias) layer.gate_bias = f32("gate_bias");
    swiglu(layer).w1 = f32("w1");
    swiglu(layer).w2 = f32("w2");
    swiglu(layer).w3 = f32("w3");
    if (a.num_shared_experts > 0) {
      layer.shared_w1->weight = f32("shared_w1");
      layer.shared_w2->weight = f32("shared_w2");
      layer.shared_w3->weight = f32("shared_w3");
    }
    at::Tensor bias64;
    if (a.load_balance_coeff) {
      bias64 = at::randn({kExperts}, at::kDouble) * 0.2;  // large enough to change choices
      layer.expert_bias = bias64.to(at::kFloat);
    }
    layer.tokens_per_expert = at::zeros({kExperts});
    const at::Tensor x64 = at::randn({2, 5, kDim}, at::kDouble).requires_grad_(true);
    const at::Tensor x32 = x64.detach().to(at::kFloat).requires_grad_(true);
    const at::Tensor g64 = at::randn({2, 5, kDim}, at::kDouble);

    const at::Tensor out = layer.forward(x32);
    torch::autograd::backward({out}, {g64.to(at::kFloat)});
    const Reference ref = reference(x64.view({10, kDim}), p, a, bias64);
    torch::autograd::backward({ref.out}, {g64.view({10, kDim})});

    CHECK(worst(out.view({10, kDim}), ref.out.detach()) < 1e-5);
    std::vector<float> counts(ref.counts.begin(), ref.counts.end());
    CHECK(at::equal(layer.tokens_per_expert, at::tensor(counts)));
    CHECK(worst(x32.grad(), x64.grad()) < 1e-5);
    const std::vector<std::pair<std::string, at::Tensor>> grads = {
        {"gate", layer.gate.weight.grad()}, {"w1", swiglu(layer).w1.grad()}, {"w2", swiglu(layer).w2.grad()}, {"w3", swiglu(layer).w3.grad()}};
    for (const auto& [name, grad] : grads) {
      INFO(name);
      REQUIRE(grad.defined());
      CHECK(worst(grad, p.f64.at(name).grad()) < 1e-5);
    }
    if (a.gate_bias) CHECK(worst(layer.gate_bias.grad(), p.f64.at("gate_bias").grad()) < 1e-5);
    if (a.num_shared_experts > 0) CHECK(worst(layer.shared_w2->weight.grad(), p.f64.at("shared_w2").grad()) < 1e-5);
    // A second forward adds its counts (torchtitan sums them until the optimizer step).
    at::NoGradGuard no_grad;
    layer.forward(x32);
    CHECK(at::equal(layer.tokens_per_expert, 2 * at::tensor(counts)));
  }
}

TEST_CASE("MoE load balancing moves the bias toward under-loaded experts, zero-mean", "[model][moe]") {
  at::Tensor bias = at::zeros({4});
  update_expert_bias(bias, at::tensor(std::vector<float>{3, 1, 2, 2}), 0.1);
  // mean 2: sign(mean - count) = [-1, 1, 0, 0], already zero-mean.
  CHECK(at::allclose(bias, at::tensor(std::vector<float>{-0.1f, 0.1f, 0, 0})));
  bias.zero_();
  update_expert_bias(bias, at::tensor(std::vector<float>{4, 0, 0, 0}), 0.1);
  // sign = [-1, 1, 1, 1] * 0.1, mean 0.05: delta = [-0.15, 0.05, 0.05, 0.05].
  CHECK(at::allclose(bias, at::tensor(std::vector<float>{-0.15f, 0.05f, 0.05f, 0.05f})));
}

TEST_CASE("MoE arguments that cannot route are errors naming the field", "[model][moe]") {
  MoEArgs a;
  a.num_experts = 8;
  a.top_k = 9;
  CHECK_THROWS_WITH(check_moe_args(a), Contains("top_k 9") && Contains("num_experts 8"));
  a.top_k = 2;
  a.score_func = "relu";
  CHECK_THROWS_WITH(check_moe_args(a), Contains("score_func 'relu'") && Contains("softmax, sigmoid"));
  a.score_func = "softmax";
  a.num_expert_groups = 3;
  a.num_limited_groups = 1;
  CHECK_THROWS_WITH(check_moe_args(a), Contains("num_expert_groups 3 must divide num_experts 8"));
  a.num_expert_groups = 8;
  CHECK_THROWS_WITH(check_moe_args(a), Contains("1 expert(s) per group"));
  a.num_expert_groups = 4;
  a.num_limited_groups.reset();
  CHECK_THROWS_WITH(check_moe_args(a), Contains("num_limited_groups is not"));
  a.num_limited_groups = 1;
  a.top_k = 3;
  CHECK_THROWS_WITH(check_moe_args(a), Contains("top_k 3 exceeds the 2 experts"));
  a.top_k = 2;
  CHECK_NOTHROW(check_moe_args(a));
}

TEST_CASE("MoE layer equals torchtitan 0.2.2's own MoE module on the same weights, forward and backward",
          "[model][moe]") {
  // tests/fixtures/torchtitan/v0.2.2/moe_layer.json: what torchtitan's moe.py computed (written by
  // scripts/reference/torchtitan_moe.py, float32, the for-loop experts). Every weight and input is
  // scale * sin(1.7 i + seed) over its flat index, computed in float64 and rounded to float32 on
  // both sides. Both run the same float32 operations per expert; only the order of sums may
  // differ (the CPU's vector kernels, the combine, the gradient accumulation over experts). Two
  // such runs differ by at most the sum of their rounding errors against the exact result; the
  // fixture holds torchtitan's own (float32_error: its largest difference from a float64 twin of
  // the same module, per tensor), and titan's is of that size: the bound is 4x it. The router's
  // gradients are the ill-conditioned ones (the softmax and the top-k renormalization subtract
  // nearly equal terms): float32's own error there is 1-3e-6 of the tensor's largest value,
  // 1e-7 elsewhere, while any routing or weighting difference is O(0.1).
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  std::ifstream in(std::filesystem::path(src) / "tests/fixtures/torchtitan/v0.2.2/moe_layer.json");
  REQUIRE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const int64_t D = fixture.at("dim"), H = fixture.at("hidden_dim"), E = fixture.at("num_experts");
  const auto values = [](const std::vector<int64_t>& shape, int seed, double scale) {
    return titan::testing::sin_values(shape, seed, scale);
  };
  auto as_tensor = [](const nlohmann::json& list) { return at::tensor(list.get<std::vector<float>>()); };
  auto close = [](const at::Tensor& got, const at::Tensor& want, double float32_error) {
    const double diff = (got.flatten() - want).abs().max().item<double>();
    INFO("largest difference " << diff << ", torchtitan's own float32 error " << float32_error);
    return diff <= 4 * float32_error;
  };
  REQUIRE(fixture.at("cases").size() == 4);
  for (const nlohmann::json& c : fixture.at("cases")) {
    INFO(c.at("name").get<std::string>());
    const nlohmann::json& f = c.at("args");
    MoEArgs a;
    a.num_experts = f.value("num_experts", int64_t{8});
    a.num_shared_experts = f.value("num_shared_experts", int64_t{1});
    a.score_func = f.value("score_func", std::string("sigmoid"));
    a.route_norm = f.value("route_norm", false);
    a.route_scale = f.value("route_scale", 1.0);
    a.gate_bias = f.value("gate_bias", false);
    a.score_before_experts = f.value("score_before_experts", true);
    a.top_k = f.value("top_k", int64_t{1});
    if (f.contains("num_expert_groups")) a.num_expert_groups = f.at("num_expert_groups").get<int64_t>();
    if (f.contains("num_limited_groups")) a.num_limited_groups = f.at("num_limited_groups").get<int64_t>();
    if (f.contains("load_balance_coeff") && f.at("load_balance_coeff").is_null()) a.load_balance_coeff.reset();
    a.force_load_balance = f.value("_debug_force_load_balance", false);
    MoE layer("moe", a, D, H);
    auto leaf = [](at::Tensor t) { return t.requires_grad_(true); };
    layer.gate.weight = leaf(values({E, D}, 1, 0.5));
    swiglu(layer).w1 = leaf(values({E, H, D}, 2, 0.4));
    swiglu(layer).w2 = leaf(values({E, D, H}, 3, 0.4));
    swiglu(layer).w3 = leaf(values({E, H, D}, 4, 0.4));
    if (a.gate_bias) layer.gate_bias = leaf(values({E}, 5, 0.5));
    if (a.num_shared_experts > 0) {
      const int64_t sh = H * a.num_shared_experts;
      layer.shared_w1->weight = leaf(values({sh, D}, 6, 0.4));
      layer.shared_w2->weight = leaf(values({D, sh}, 7, 0.4));
      layer.shared_w3->weight = leaf(values({sh, D}, 8, 0.4));
    }
    layer.tokens_per_expert = at::zeros({E});
    if (a.load_balance_coeff) layer.expert_bias = values({E}, 9, 0.2);
    const at::Tensor x = leaf(values({2, 3, D}, 10, 1.0));
    const at::Tensor out = layer.forward(x);
    torch::autograd::backward({out}, {values({2, 3, D}, 11, 1.0)});
    const nlohmann::json& error = c.at("float32_error");
    CHECK(close(out, as_tensor(c.at("out")), error.at("out")));
    CHECK(at::equal(layer.tokens_per_expert, as_tensor(c.at("tokens_per_expert"))));
    const nlohmann::json& grads = c.at("grads");
    std::vector<std::pair<std::string, at::Tensor>> mine = {
        {"x", x.grad()}, {"router.gate.weight", layer.gate.weight.grad()}, {"experts.w1", swiglu(layer).w1.grad()},
        {"experts.w2", swiglu(layer).w2.grad()}, {"experts.w3", swiglu(layer).w3.grad()}};
    if (a.gate_bias) mine.push_back({"router.gate.bias", layer.gate_bias.grad()});
    if (a.num_shared_experts > 0) {
      mine.push_back({"shared_experts.w1.weight", layer.shared_w1->weight.grad()});
      mine.push_back({"shared_experts.w2.weight", layer.shared_w2->weight.grad()});
      mine.push_back({"shared_experts.w3.weight", layer.shared_w3->weight.grad()});
    }
    CHECK(mine.size() == grads.size());
    for (const auto& [name, grad] : mine) {
      INFO(name);
      REQUIRE(grad.defined());
      CHECK(close(grad, as_tensor(grads.at(name)), error.at(name)));
    }
  }
}

TEST_CASE("CUDA: the experts' grouped GEMM equals the per-expert loop on the CPU", "[model][moe][cuda]") {
  // bfloat16 on the GPU (LibTorch's grouped GEMM: one kernel per projection) against the CPU loop
  // in float32 on the very same bf16 values. Each output element is a dot product over D = 64
  // (then H = 96) terms accumulated in float32 and rounded to bf16 after each of the three
  // products and the SwiGLU: a few units of bf16's roundoff u = 2^-8 of the largest value;
  // bound 8u. A row sent to the wrong expert is off by O(1).
  at::manual_seed(7);
  const int64_t E = 8, D = 64, H = 96;
  const std::vector<int64_t> counts = {5, 0, 17, 1, 0, 33, 8, 2};  // uneven, two empty experts
  int64_t T = 0;
  for (int64_t c : counts) T += c;
  const at::Tensor x0 = at::randn({T, D}).to(at::kBFloat16), g0 = at::randn({T, D}).to(at::kBFloat16);
  const at::Tensor w10 = (at::randn({E, H, D}) * 0.1).to(at::kBFloat16), w30 = (at::randn({E, H, D}) * 0.1).to(at::kBFloat16);
  const at::Tensor w20 = (at::randn({E, D, H}) * 0.1).to(at::kBFloat16);
  const auto cuda = at::TensorOptions().device(c10::kCUDA).dtype(at::kBFloat16);
  auto run = [&](const at::TensorOptions& o) {
    at::Tensor x = x0.to(o).requires_grad_(true), w1 = w10.to(o).requires_grad_(true);
    at::Tensor w2 = w20.to(o).requires_grad_(true), w3 = w30.to(o).requires_grad_(true);
    const at::Tensor y = titan::model::moe::grouped_experts(x, w1, w2, w3, counts);
    torch::autograd::backward({y}, {g0.to(o)});
    return std::vector<at::Tensor>{y, x.grad(), w1.grad(), w2.grad(), w3.grad()};
  };
  const std::vector<at::Tensor> gpu = run(cuda), cpu = run(at::TensorOptions().dtype(at::kFloat));
  const char* names[] = {"output", "x grad", "w1 grad", "w2 grad", "w3 grad"};
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double largest = cpu[i].abs().max().item<double>();
    INFO(names[i] << ": largest " << largest);
    CHECK((gpu[i].cpu().to(at::kFloat) - cpu[i]).abs().max().item<double>() <= 8.0 / 256 * largest);
  }
}
