// tests/torchtitan_model_fixture.h — one model against a torchtitan fixture
// (tests/fixtures/torchtitan/<release>/<family>_model.json, written by
// scripts/reference/torchtitan_<family>.py from the release's own model.py): the same weights,
// tokens and output gradient on both sides, the logits and every gradient compared.
//
// What both sides compute: parameter k of the fixture's name list (torchtitan's
// named_parameters order) holds sin_values(shape, k + 1, 0.2) (the embedding at scale 1, a name
// ending in a suffix of the fixture's "parameter_scales" at that scale, every norm weight
// 1 + 0.1 sin); each MoE layer's expert_bias sin_values({E}, 500 + layer, 0.2);
// token i is (7 i + 3) mod vocab over batch x seq; the backward seeds the logits with
// sin_values(shape, 99, 1). A gradient is compared by its norm and its projection on
// sin_values(shape, 1000 + k + 1, 1) (the fixture holds two numbers per tensor, not the tensor).
#pragma once

#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "tests/sin_values.h"

namespace titan::testing {

// What a fixture run leaves for the caller's own checks: the parameters by name (their gradients
// filled) and the logits.
struct FixtureRun {
  std::map<std::string, at::Tensor*> params;
  at::Tensor logits;
};

// Runs `model` (float32, on the CPU, not yet materialized) on fixture case `c` and checks its
// logits within `rel` of the largest logit, and each gradient's norm within `rel` of the
// fixture's (its projection within `rel` x the norms' product: Cauchy-Schwarz).
inline FixtureRun check_model_against_fixture(model::Transformer& model, const nlohmann::json& fixture,
                                              const nlohmann::json& c, double rel) {
  model.materialize(c10::kCPU, at::kFloat);
  std::map<std::string, at::Tensor*> params;
  model.visit_params([&](const std::string& fqn, at::Tensor& p) { params[fqn] = &p; });
  const std::vector<std::string> names = c.at("parameters");
  REQUIRE(std::set<std::string>(names.begin(), names.end()).size() == params.size());
  for (size_t k = 0; k < names.size(); ++k) {
    INFO(names[k]);
    REQUIRE(params.count(names[k]) == 1);
    at::Tensor& p = *params.at(names[k]);
    const auto ends_with = [&](const std::string& suffix) {
      return names[k].size() >= suffix.size() &&
             names[k].compare(names[k].size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    double scale = names[k] == "tok_embeddings.weight" ? 1.0 : 0.2;
    for (const auto& [suffix, s] : fixture.value("parameter_scales", std::map<std::string, double>{}))
      if (ends_with(suffix)) scale = s;
    const int seed = static_cast<int>(k) + 1;
    p = (ends_with("norm.weight") ? sin_values(p.sizes().vec(), seed, 0.1, 1.0)
                                  : sin_values(p.sizes().vec(), seed, scale))
            .requires_grad_(true);
  }
  model.materialize_buffers(c10::kCPU);
  for (model::TransformerBlock* block : model.blocks())
    if (block->moe)
      block->moe->expert_bias =
          sin_values({block->moe->expert_bias.size(0)}, 500 + static_cast<int>(block->layer_id), 0.2);
  const int64_t B = fixture.at("batch"), S = fixture.at("seq"), vocab = model.args().vocab_size;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < B * S; ++i) ids.push_back((7 * i + 3) % vocab);
  const at::Tensor tokens = at::tensor(ids).view({B, S});
  const at::Tensor logits = model.forward(tokens, model.rope_table());
  torch::autograd::backward({logits}, {sin_values(logits.sizes().vec(), 99, 1.0)});
  const at::Tensor want = at::tensor(c.at("logits").get<std::vector<float>>());
  const double scale = want.abs().max().item<double>();
  const double logit_error = (logits.flatten() - want).abs().max().item<double>();
  INFO("max logit difference " << logit_error << " of max " << scale);
  CHECK(logit_error <= rel * scale);
  const nlohmann::json& grads = c.at("grads");
  for (size_t k = 0; k < names.size(); ++k) {
    INFO(names[k]);
    const at::Tensor g = params.at(names[k])->grad();
    REQUIRE(g.defined());
    const std::vector<double> w = grads.at(names[k]);
    const at::Tensor v = sin_values(g.sizes().vec(), 1000 + static_cast<int>(k) + 1, 1.0).to(at::kDouble);
    const double norm = g.to(at::kDouble).norm().item<double>();
    const double projection = (g.to(at::kDouble) * v).sum().item<double>();
    CHECK(std::abs(norm - w[0]) <= rel * w[0]);
    CHECK(std::abs(projection - w[1]) <= rel * w[0] * v.norm().item<double>());
  }
  return {params, logits.detach()};
}

}  // namespace titan::testing
