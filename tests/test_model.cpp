// Llama model: flavor shapes, parameter counts, FLOPs, meta build, init, forward, and gradients
// against finite differences in float64.
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "model/flavors.h"
#include "model/transformer.h"

using namespace titan::model;

TEST_CASE("flavor shapes follow torchtitan", "[model]") {
  CHECK(model_flavor("llama3", "debugmodel").ffn_hidden_dim() == 768);
  CHECK(model_flavor("llama3", "8B").ffn_hidden_dim() == 14336);
  CHECK(model_flavor("llama3", "70B").ffn_hidden_dim() == 28672);
  CHECK(model_flavor("llama3", "405B").ffn_hidden_dim() == 53248);
  CHECK(model_flavor("llama3", "8B").head_dim() == 128);
  CHECK(model_flavor("llama3", "405B").kv_heads() == 8);
  CHECK_THROWS_WITH(model_flavor("llama3", "7B"), Catch::Contains("debugmodel, 8B, 70B, 405B, 100M"));
}

TEST_CASE("parameter counts without allocating", "[model]") {
  // Exact counts from the shapes; 8B is the published 8.03e9.
  CHECK(count_params(model_flavor("llama3", "8B")).total == 8030261248LL);
  CHECK(count_params(model_flavor("llama3", "70B")).total == 70553706496LL);
  CHECK(count_params(model_flavor("llama3", "405B")).total == 405853388800LL);
  // 8B_4layers (the single-GPU benchmark model) is 8B with 28 of its 32 layers removed.
  const auto full = count_params(model_flavor("llama3", "8B")), four = count_params(model_flavor("llama3", "8B_4layers"));
  CHECK(four.per_layer == full.per_layer);
  CHECK(four.total == full.total - 28 * full.per_layer);
  const auto debug = count_params(model_flavor("llama3", "debugmodel"));
  CHECK(debug.embedding == 2048 * 256);
  CHECK(debug.total == 2 * 2048 * 256 + 256 + 6 * (4 * 256 * 256 + 3 * 256 * 768 + 2 * 256));
}

TEST_CASE("flops per token is torchtitan's formula", "[model]") {
  const ModelArgs a = model_flavor("llama3", "8B");
  const auto c = count_params(a);
  const double expected = 6.0 * (c.total - c.embedding) + 12.0 * 32 * 32 * 128 * 8192;
  CHECK(flops_per_token(a, 8192) == Approx(expected).epsilon(1e-12));
  // 8B at seq 8192: about 5.8e10 (the familiar ~6 x 7.5e9 plus attention).
  CHECK(flops_per_token(a, 8192) == Approx(5.8e10).epsilon(0.02));
}

namespace {
ModelArgs tiny_args() {
  ModelArgs a;
  a.dim = 16;
  a.n_layers = 2;
  a.n_heads = 4;
  a.n_kv_heads = 2;  // GQA
  a.vocab_size = 32;
  a.multiple_of = 8;
  a.max_seq_len = 8;
  return a;
}
}  // namespace

TEST_CASE("model is built on meta and named like torchtitan", "[model]") {
  Transformer model(model_flavor("llama3", "8B"));  // 8B on meta: no memory
  std::vector<std::string> names;
  int64_t numel = 0;
  model.visit_params([&](const std::string& n, at::Tensor& p) {
    CHECK(p.device().is_meta());
    names.push_back(n);
    numel += p.numel();
  });
  CHECK(numel == count_params(model_flavor("llama3", "8B")).total);
  REQUIRE(names.size() == 1 + 32 * 9 + 2);
  CHECK(names[0] == "tok_embeddings.weight");
  CHECK(names[1] == "layers.0.attention.wq.weight");
  CHECK(names[5] == "layers.0.feed_forward.w1.weight");
  CHECK(names[8] == "layers.0.attention_norm.weight");
  CHECK(names[9] == "layers.0.ffn_norm.weight");
  CHECK(names[names.size() - 2] == "norm.weight");
  CHECK(names.back() == "output.weight");
  CHECK(model.linears().size() == 32 * 7 + 1);
  CHECK(model.linears().back()->fqn() == "output");
}

TEST_CASE("init follows torchtitan's scheme and is deterministic", "[model]") {
  ModelArgs a = tiny_args();
  a.dim = 64;
  a.n_layers = 3;
  Transformer m1(a), m2(a);
  m1.materialize(c10::kCPU, at::kFloat);
  m2.materialize(c10::kCPU, at::kFloat);
  m1.init_weights(7);
  m2.init_weights(7);
  std::map<std::string, at::Tensor> p1, p2;
  m1.visit_params([&](const std::string& n, at::Tensor& p) { p1[n] = p; });
  m2.visit_params([&](const std::string& n, at::Tensor& p) { p2[n] = p; });
  for (auto& [n, t] : p1) CHECK(at::equal(t, p2[n]));
  CHECK(p1["norm.weight"].eq(1).all().item<bool>());
  // Sample stds (thousands of values: ~2-3% sampling error).
  CHECK(p1["tok_embeddings.weight"].std().item<double>() == Approx(1.0).epsilon(0.05));
  CHECK(p1["layers.0.attention.wq.weight"].std().item<double>() == Approx(0.02).epsilon(0.1));
  CHECK(p1["layers.2.feed_forward.w2.weight"].std().item<double>() ==
        Approx(0.02 / std::sqrt(6.0)).epsilon(0.1));
  // The output projection is cut at 3 std = 3 / sqrt(dim).
  CHECK(p1["output.weight"].abs().max().item<double>() <= 3.0 / 8.0 + 1e-6);
}

TEST_CASE("rotary embedding matches the complex-number form", "[model]") {
  const int64_t hd = 8, seq = 5;
  RotaryTable table = make_rotary_table(hd, seq, 10000.0, c10::kCPU);
  at::Tensor x = at::randn({1, seq, 2, hd}, at::kDouble);
  at::Tensor y = apply_rotary(x, table);
  for (int64_t s = 0; s < seq; ++s)
    for (int64_t i = 0; i < hd / 2; ++i) {
      const double angle = s * std::pow(10000.0, -2.0 * i / hd);
      const double re = x[0][s][1][2 * i].item<double>(), im = x[0][s][1][2 * i + 1].item<double>();
      // float32 tables: agree to ~1e-6 relative.
      CHECK(y[0][s][1][2 * i].item<double>() ==
            Approx(re * std::cos(angle) - im * std::sin(angle)).margin(1e-5));
      CHECK(y[0][s][1][2 * i + 1].item<double>() ==
            Approx(re * std::sin(angle) + im * std::cos(angle)).margin(1e-5));
    }
}

TEST_CASE("forward shapes and causality", "[model]") {
  Transformer model(tiny_args());
  model.materialize(c10::kCPU, at::kFloat);
  model.init_weights(1);
  at::NoGradGuard no_grad;
  at::Tensor tokens = at::randint(0, 32, {2, 8}, at::kLong);
  at::Tensor logits = model.forward(tokens, model.rope_table());
  CHECK(logits.sizes() == at::IntArrayRef({2, 8, 32}));
  // Changing the last token must not change earlier positions' logits.
  at::Tensor changed = tokens.clone();
  changed[0][7] = (changed[0][7].item<int64_t>() + 1) % 32;
  at::Tensor logits2 = model.forward(changed, model.rope_table());
  CHECK(at::allclose(logits.narrow(1, 0, 7), logits2.narrow(1, 0, 7)));
  CHECK_FALSE(at::allclose(logits[0][7], logits2[0][7]));
}

TEST_CASE("gradients match central finite differences in float64", "[model]") {
  Transformer model(tiny_args());
  model.materialize(c10::kCPU, at::kDouble);
  model.init_weights(3);
  std::vector<std::pair<std::string, at::Tensor*>> params;
  model.visit_params([&](const std::string& n, at::Tensor& p) {
    p.requires_grad_(true);
    params.emplace_back(n, &p);
  });
  at::Tensor tokens = at::randint(0, 32, {2, 6}, at::kLong);
  at::Tensor labels = at::randint(0, 32, {2, 6}, at::kLong);
  auto loss_fn = [&] {
    return at::cross_entropy_loss(model.forward(tokens, model.rope_table()).flatten(0, 1), labels.flatten());
  };
  torch::autograd::backward({loss_fn()});
  at::NoGradGuard no_grad;
  const double h = 1e-6;
  int checked = 0;
  for (auto& [name, p] : params) {
    at::Tensor flat = p->view(-1);
    at::Tensor grad = p->grad().view(-1);
    for (int64_t idx : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
      const double orig = flat[idx].item<double>();
      flat[idx] = orig + h;
      const double up = loss_fn().item<double>();
      flat[idx] = orig - h;
      const double down = loss_fn().item<double>();
      flat[idx] = orig;
      const double numeric = (up - down) / (2 * h);
      // Central differences in float64: truncation O(h^2) ~1e-12 and rounding ~eps/h ~1e-10,
      // so 1e-7 absolute (+1e-5 relative) is a wide margin that still catches any wrong term.
      INFO(name << "[" << idx << "]");
      CHECK(grad[idx].item<double>() == Approx(numeric).margin(1e-7).epsilon(1e-5));
      ++checked;
    }
  }
  CHECK(checked == 3 * (1 + 2 * 9 + 2));
}
