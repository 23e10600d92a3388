// The gpt-oss family (model.name = gpt_oss): titan's Transformer with biased grouped-query
// attention, per-head sinks, sliding windows on the even blocks, YaRN, and gpt-oss's biased
// experts with the clamped SwiGLU, against torchtitan 0.2.2's own GptOssModel on the same weights
// and tokens (tests/fixtures/torchtitan/v0.2.2/gpt_oss_model.json, written by
// scripts/reference/torchtitan_gpt_oss.py, which runs the release's model.py, its gpt-oss moe.py,
// the shared moe.py and attention.py with FlexAttention evaluated under the release's own dense
// mask mods).
//
// Tolerance: as tests/test_deepseek_v3.cpp's: both sides run float32 over the same operations with
// different kernels and reduction orders (fused RMSNorm and CPU flash attention with the sinks'
// logaddexp vs torch's composites and a dense softmax), through four blocks. The fixture keeps the
// attention logits O(1) (its wq / wk at scale 0.05, "parameter_scales"; at the common 0.2 the
// coherent sin weights gave logits of +-50, a near one-hot softmax that amplified float32
// rounding into the gradients and sink probabilities of 1e-9). There the largest difference
// measured is ~3e-6 of the logits' and the gradients' scale; 1e-5 leaves 3x, while a sink
// applied as a value column, a window one key off, a missing mscale^2, the gate and linear
// halves swapped or a clamp on the wrong side are off by O(1). The fixture's clamped_fraction
// says the clamp acts: ~46% of the gates above swiglu_limit, ~90% of the linear halves outside it.
#include <ATen/ops/tensor.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "model/gpt_oss/args.h"
#include "model/transformer.h"
#include "tests/torchtitan_model_fixture.h"

using namespace titan::model;
using titan::model::gpt_oss::GptOssArgs;

namespace {

nlohmann::json load_fixture() {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  std::ifstream in(std::filesystem::path(src) / "tests/fixtures/torchtitan/v0.2.2/gpt_oss_model.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// The fixture's small model: debugmodel's family switches with the fixture's shapes.
ModelArgs fixture_args(const nlohmann::json& fixture, const nlohmann::json& c) {
  const nlohmann::json& shapes = fixture.at("shapes");
  const nlohmann::json& moe_args = fixture.at("moe");
  ModelArgs a = model_flavor("gpt_oss", "debugmodel");
  a.vocab_size = shapes.at("vocab_size");
  a.dim = shapes.at("dim");
  a.n_layers = shapes.at("n_layers");
  a.n_heads = shapes.at("n_heads");
  a.n_kv_heads = shapes.at("n_kv_heads");
  a.explicit_head_dim = shapes.at("head_dim");
  a.moe_hidden_dim = shapes.at("moe_inter_dim");
  a.norm_eps = shapes.at("norm_eps");
  a.rope_theta = shapes.at("rope_theta");
  a.max_seq_len = shapes.at("max_seq_len");
  a.block_causal = c.at("attn_mask_type") == "block_causal";
  a.eos_id = fixture.at("eos_id");
  a.moe->num_experts = moe_args.at("num_experts");
  a.moe->top_k = moe_args.at("top_k");
  auto g = std::make_shared<GptOssArgs>();
  g->swiglu_limit = shapes.at("swiglu_limit");
  g->sliding_window_size = shapes.at("sliding_window_size");
  g->original_seq_len = shapes.at("original_seq_len");
  g->rope_factor = shapes.at("rope_factor");
  g->ntk_alpha = shapes.at("ntk_alpha");
  g->ntk_beta = shapes.at("ntk_beta");
  a.family_args = g;
  return a;
}

}  // namespace

TEST_CASE("gpt-oss (biased attention with sinks, sliding windows on even blocks, YaRN, clamped-SwiGLU biased experts, "
          "causal and block-causal) equals torchtitan 0.2.2's GptOssModel",
          "[model][gpt_oss]") {
  const nlohmann::json fixture = load_fixture();
  for (const nlohmann::json& c : fixture.at("cases")) {
    INFO("case " << c.at("name").get<std::string>());
    const ModelArgs a = fixture_args(fixture, c);
    Transformer model(a);
    const titan::testing::FixtureRun run = titan::testing::check_model_against_fixture(model, fixture, c, 1e-5);
    int64_t numel = 0;
    for (const auto& [fqn, p] : run.params) numel += p->numel();
    CHECK(count_params(a).total == numel);
    // The same routing decisions in every block (each one MoE).
    const std::vector<std::vector<float>> counts = c.at("tokens_per_expert");
    size_t moe_block = 0;
    for (TransformerBlock* block : model.blocks()) {
      REQUIRE(block->moe != nullptr);
      CHECK(at::equal(block->moe->tokens_per_expert, at::tensor(counts.at(moe_block++))));
    }
    CHECK(moe_block == counts.size());
  }
}

TEST_CASE("gpt-oss flavors: torchtitan's shapes, windows on the even blocks, parameter counts", "[model][gpt_oss]") {
  const ModelArgs big = model_flavor("gpt_oss", "120b");
  const GptOssArgs& g = big.family_args_as<GptOssArgs>();
  CHECK((big.dim == 2880 && big.n_layers == 36 && big.n_heads == 64 && big.kv_heads() == 8 && big.head_dim() == 64 &&
         big.vocab_size == 201088 && big.moe_hidden_dim == 2880));
  CHECK((big.moe->num_experts == 128 && big.moe->top_k == 4 && big.moe->score_func == "softmax" &&
         big.moe->route_norm && big.moe->gate_bias && big.moe->num_shared_experts == 0));
  CHECK((g.sliding_window_size == 128 && g.swiglu_limit == 7.0 && g.window(0) == 128 && g.window(1) == 0));
  // OpenAI's model card: gpt-oss-120b 116.8B parameters in total, 5.1B active per token;
  // gpt-oss-20b 20.9B and 3.6B. (The card counts the embedding once in "active"; torchtitan's
  // flavors are those models' shapes.)
  const ParamCount b120 = count_params(big), b20 = count_params(model_flavor("gpt_oss", "20b"));
  CHECK(std::abs(static_cast<double>(b120.total) / 1e9 - 116.8) < 0.2);
  CHECK(std::abs(static_cast<double>(b20.total) / 1e9 - 20.9) < 0.2);
  for (const char* f : {"debugmodel", "20b", "120b", "debugmodel_small"}) CHECK_NOTHROW(model_flavor("gpt_oss", f));
  CHECK_THROWS_WITH(model_flavor("gpt_oss", "7b"), Catch::Contains("not a gpt_oss flavor") &&
                                                       Catch::Contains("debugmodel_small"));
}
