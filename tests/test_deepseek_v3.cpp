// The DeepSeek-V3 family (model.name = deepseek_v3): titan's Transformer with multi-head latent
// attention, dense-then-MoE blocks and YaRN against torchtitan 0.2.2's own DeepSeekV3Model on the
// same weights and tokens (tests/fixtures/torchtitan/v0.2.2/deepseek_v3_model.json, written by
// scripts/reference/torchtitan_deepseek_v3.py, which runs the release's model.py and moe.py);
// one case adds two multi-token prediction depths, which the script builds on the release's
// blocks as torchtitan main's mtp.py does (the depths' logits, gradients and loss).
//
// Tolerance: as tests/test_qwen3.cpp's: both run float32 over the same operations with different
// kernels (fused RMSNorm and CPU flash attention vs torch's composites and SDPA), so sums are
// reordered through three blocks; the rotary frequencies are computed in float64 here, in float32
// by torchtitan (a rounding of each frequency, < 1e-7 relative, times a position below 16).
// 1e-5 of the largest logit (and of each gradient's norm times the projection vector's norm) is
// ~10x what such reorderings give, while a wrong split of the heads, a missing mscale, a rope
// over the wrong part or a wrong dense/MoE boundary is off by O(1).
#include <ATen/core/Reduction.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/deepseek_v3/args.h"
#include "model/flavors.h"
#include "model/transformer.h"
#include "tests/torchtitan_model_fixture.h"

using namespace titan::model;
using titan::model::deepseek_v3::DeepSeekV3Args;

namespace {

// The fixture's small model: debugmodel's family switches with the fixture's shapes.
ModelArgs fixture_args(const nlohmann::json& shapes, const nlohmann::json& c) {
  ModelArgs a = model_flavor("deepseek_v3", "debugmodel");
  a.vocab_size = shapes.at("vocab_size");
  a.dim = shapes.at("dim");
  a.explicit_hidden_dim = shapes.at("inter_dim");
  a.moe_hidden_dim = shapes.at("moe_inter_dim");
  a.n_layers = shapes.at("n_layers");
  a.n_heads = shapes.at("n_heads");
  a.max_seq_len = shapes.at("max_seq_len");
  a.norm_eps = shapes.at("norm_eps");
  a.rope_theta = shapes.at("rope_theta");
  auto mla = std::make_shared<DeepSeekV3Args>(a.family_args_as<DeepSeekV3Args>());
  mla->n_dense_layers = shapes.at("n_dense_layers");
  mla->q_lora_rank = c.at("q_lora_rank");
  mla->kv_lora_rank = shapes.at("kv_lora_rank");
  mla->qk_nope_head_dim = shapes.at("qk_nope_head_dim");
  mla->qk_rope_head_dim = shapes.at("qk_rope_head_dim");
  mla->v_head_dim = shapes.at("v_head_dim");
  mla->original_seq_len = c.at("original_seq_len");
  mla->rope_factor = shapes.at("rope_factor");
  mla->beta_fast = shapes.at("beta_fast");
  mla->beta_slow = shapes.at("beta_slow");
  mla->mscale = shapes.at("mscale");
  a.family_args = mla;
  a.mtp_layers = c.value("mtp_layers", int64_t{0});
  moe::MoEArgs m;
  m.num_experts = 4;
  m.score_before_experts = false;
  if (c.at("routing") == "sigmoid") {  // 671B's kind: sigmoid, group-limited, normalized, scaled
    m.num_shared_experts = 1;
    m.top_k = 2;
    m.score_func = "sigmoid";
    m.route_norm = true;
    m.route_scale = 2.5;
    m.num_expert_groups = 2;
    m.num_limited_groups = 1;
  } else {  // the debug flavors': softmax, two shared experts
    m.num_shared_experts = 2;
    m.top_k = 3;
    m.score_func = "softmax";
    m.route_norm = false;
  }
  a.moe = m;
  return a;
}

}  // namespace

TEST_CASE("DeepSeek-V3 (latent attention, q direct or low-rank, YaRN, dense then MoE blocks) equals torchtitan 0.2.2's "
          "DeepSeekV3Model",
          "[model][deepseek_v3]") {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  std::ifstream in(std::filesystem::path(src) / "tests/fixtures/torchtitan/v0.2.2/deepseek_v3_model.json");
  REQUIRE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const nlohmann::json& shapes = fixture.at("shapes");
  for (const nlohmann::json& c : fixture.at("cases")) {
    INFO("case " << c.at("case").get<std::string>());
    const ModelArgs a = fixture_args(shapes, c);
    CHECK(std::abs(a.family_args_as<DeepSeekV3Args>().softmax_scale(a.max_seq_len) - c.at("softmax_scale").get<double>()) <=
          1e-15);
    Transformer model(a);
    const titan::testing::FixtureRun run = titan::testing::check_model_against_fixture(model, fixture, c, 1e-5);
    int64_t numel = 0;
    for (const auto& [fqn, p] : run.params) numel += p->numel();
    CHECK(count_params(a).total == numel);
    // The same routing decisions in every MoE block (the first block is dense).
    const std::vector<std::vector<float>> counts = c.at("tokens_per_expert");
    size_t moe_block = 0;
    for (TransformerBlock* block : model.blocks()) {
      CHECK((block->moe != nullptr) == (block->layer_id >= shapes.at("n_dense_layers").get<int64_t>()));
      if (block->moe) CHECK(at::equal(block->moe->tokens_per_expert, at::tensor(counts.at(moe_block++))));
    }
    CHECK(moe_block == counts.size());
    if (a.mtp_layers > 0) {
      // Multi-token prediction's loss (torchtitan main's MTPLoss, positions restarting at each
      // packed document) on these logits: the rolled labels, the ignored positions, the weight.
      // The logits equal within 1e-5 of their largest; a sum over 3 x 24 cross entropies moves
      // by less than 1e-5 relative, while a label rolled into another document or a missing
      // 1 / D is off by O(1).
      const nlohmann::json& mtp = c.at("mtp_loss");
      std::vector<at::Tensor> labels, documents;
      for (size_t r = 0; r < mtp.at("labels").size(); ++r) {
        labels.push_back(at::tensor(mtp.at("labels")[r].get<std::vector<int64_t>>()));
        documents.push_back(at::tensor(mtp.at("documents")[r].get<std::vector<int64_t>>()));
      }
      const CrossEntropySum ce_sum = [](const at::Tensor& l, const at::Tensor& y) {
        return at::cross_entropy_loss(l.flatten(0, 1), y.flatten(), std::nullopt, at::Reduction::Sum, kIgnoreIndex);
      };
      const MtpLossSum sum = mtp_loss_sum(run.logits, at::stack(labels), at::stack(documents), a.mtp_layers,
                                          mtp.at("scale").get<double>(), ce_sum);
      const double got = sum.total.item<double>();
      const double want = mtp.at("loss_sum").get<double>();
      CHECK(std::abs(got - want) <= 1e-5 * want);
      // And against a float64 per-token reference on the same logits: depth k's target at (r, i)
      // is the label at i + k where that is in the row and in the same document; the depths'
      // mean, weighted, added to the main loss. float32 against float64 log-softmax over 64
      // classes: ~1e-7 relative per token; 1e-6 of the sum.
      const at::Tensor lp = run.logits.to(at::kDouble).log_softmax(-1);  // [(1 + D) B, S, V]
      const int64_t B = labels.size(), S = labels[0].size(0);
      double main = 0, depths = 0;
      for (int64_t d = 0; d <= a.mtp_layers; ++d)
        for (int64_t r = 0; r < B; ++r)
          for (int64_t i = 0; i + d < S; ++i) {
            if (documents[r][i + d].item<int64_t>() != documents[r][i].item<int64_t>()) continue;
            const double nll = -lp[d * B + r][i][labels[r][i + d].item<int64_t>()].item<double>();
            (d == 0 ? main : depths) += nll;
          }
      const double mean = depths / static_cast<double>(a.mtp_layers);
      CHECK(std::abs(sum.depths_mean.item<double>() - mean) <= 1e-6 * mean);
      CHECK(std::abs(got - (main + mtp.at("scale").get<double>() * mean)) <= 1e-6 * got);
    }
  }
}

TEST_CASE("DeepSeek-V3 flavors: torchtitan's shapes, dense-then-MoE blocks, parameter counts", "[model][deepseek_v3]") {
  const ModelArgs big = model_flavor("deepseek_v3", "671B");
  const DeepSeekV3Args& mla = big.family_args_as<DeepSeekV3Args>();
  CHECK((big.dim == 7168 && big.n_layers == 61 && big.n_heads == 128 && big.vocab_size == 129280 &&
         big.ffn_hidden_dim() == 18432 && big.moe_hidden_dim == 2048));
  CHECK((mla.n_dense_layers == 3 && mla.q_lora_rank == 1536 && mla.kv_lora_rank == 512 && mla.qk_head_dim() == 192 &&
         mla.v_head_dim == 128));
  CHECK((big.moe->num_experts == 256 && big.moe->top_k == 8 && big.moe->score_func == "sigmoid" &&
         *big.moe->num_expert_groups == 8 && *big.moe->num_limited_groups == 4 && big.moe->route_scale == 2.5));
  const ParamCount count = count_params(big);
  // DeepSeek-V3's published size: 671B parameters (its 14B multi-token-prediction module
  // aside), 37B activated per token.
  CHECK(std::abs(static_cast<double>(count.total) / 1e9 - 671.0) < 1.0);
  CHECK(std::abs(static_cast<double>(count.active) / 1e9 - 37.5) < 1.0);
  CHECK(count.per_block.size() == 61);
  CHECK(count.per_block[2] < count.per_block[3]);  // dense block 2, MoE block 3
  for (const char* f : {"debugmodel", "debugmodel_flex_attn", "16B", "236B", "671B", "debugmodel_small"})
    CHECK_NOTHROW(model_flavor("deepseek_v3", f));
  CHECK(model_flavor("deepseek_v3", "debugmodel_flex_attn").block_causal);
  CHECK_THROWS_WITH(model_flavor("deepseek_v3", "7B"), Catch::Contains("not a deepseek_v3 flavor") &&
                                                           Catch::Contains("debugmodel_small"));
}
