// The Qwen3 family (model.name = qwen3): titan's Transformer with Qwen3's flavor switches (an
// explicit head_dim, qk-norm, rotate-half RoPE, tied embeddings, MoE blocks) against torchtitan 0.2.2's own
// Qwen3Model on the same weights and tokens (tests/fixtures/torchtitan/v0.2.2/qwen3_model.json,
// written by scripts/reference/torchtitan_qwen3.py, which runs the release's model.py).
//
// Tolerance: both run float32 over the same operations; the kernels differ (titan's fused RMSNorm
// and CPU flash attention vs torch's composite RMSNorm and SDPA), so sums are reordered through
// two blocks: measured 7.4e-7 relative (tied) and 6.6e-7 (untied); the bound 1e-5 of the largest logit (and of each gradient's norm
// times the projection vector's norm, Cauchy-Schwarz) leaves ~10x, while a wrong rotation pairing,
// a missing qk-norm or an untied output is off by O(1).
#include <ATen/ops/tensor.h>
#include <torch/csrc/autograd/autograd.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "model/transformer.h"
#include "tests/torchtitan_model_fixture.h"

using namespace titan::model;

TEST_CASE("Qwen3 (explicit head_dim, qk-norm, rotate-half RoPE, tied or not, MoE) equals torchtitan 0.2.2's Qwen3Model",
          "[model][qwen3]") {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  std::ifstream in(std::filesystem::path(src) / "tests/fixtures/torchtitan/v0.2.2/qwen3_model.json");
  REQUIRE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const nlohmann::json& shapes = fixture.at("shapes");
  for (const nlohmann::json& c : fixture.at("cases")) {
    const bool tied = c.at("tied"), with_moe = c.at("moe");
    INFO((tied ? "tied" : "untied") << " embeddings" << (with_moe ? ", MoE blocks" : ""));
    ModelArgs a = model_flavor("qwen3", "debugmodel");  // the family's switches; the fixture's small shapes
    a.vocab_size = shapes.at("vocab_size");
    a.dim = shapes.at("dim");
    a.n_layers = shapes.at("n_layers");
    a.n_heads = shapes.at("n_heads");
    a.n_kv_heads = shapes.at("n_kv_heads");
    a.explicit_head_dim = shapes.at("head_dim");
    a.explicit_hidden_dim = shapes.at("hidden_dim");
    a.max_seq_len = shapes.at("max_seq_len");
    a.tie_embeddings = tied;
    if (with_moe) {  // model_flavor("qwen3", "debugmodel_moe")'s routing with 4 experts, top 2
      const ModelArgs moe = model_flavor("qwen3", "debugmodel_moe");
      a.moe = moe.moe;
      a.moe->num_experts = 4;
      a.moe->top_k = 2;
      a.moe_hidden_dim = 24;
    }
    CHECK(a.norm_eps == shapes.at("norm_eps").get<double>());
    CHECK(a.rope_theta == shapes.at("rope_theta").get<double>());
    Transformer model(a);
    titan::testing::check_model_against_fixture(model, fixture, c, 1e-5);
    if (with_moe) {  // the same routing decisions, counted once per forward
      const std::vector<std::vector<float>> counts = c.at("tokens_per_expert");
      for (TransformerBlock* block : model.blocks())
        CHECK(at::equal(block->moe->tokens_per_expert, at::tensor(counts[static_cast<size_t>(block->layer_id)])));
    }
  }
}

TEST_CASE("Qwen3 flavors: torchtitan's shapes, parameter counts with tied embeddings", "[model][qwen3]") {
  const ModelArgs small = model_flavor("qwen3", "0.6B"), large = model_flavor("qwen3", "8B");
  CHECK((small.dim == 1024 && small.n_layers == 28 && small.n_heads == 16 && small.n_kv_heads == 8 &&
         small.head_dim() == 128 && small.ffn_hidden_dim() == 3072 && small.tie_embeddings && small.qk_norm));
  CHECK((large.dim == 4096 && large.n_layers == 36 && large.head_dim() == 128 && large.ffn_hidden_dim() == 12288 &&
         !large.tie_embeddings));
  // Qwen3-0.6B: 596,049,920 parameters with the embedding counted once (151936 x 1024 tied), as
  // Hugging Face's Qwen/Qwen3-0.6B reports (0.6B; 0.44B without the embedding).
  CHECK(count_params(small).total == 596049920);
  CHECK(model_flavor("qwen3", "0.6B").family == "qwen3");
  CHECK_THROWS_WITH(model_flavor("qwen3", "70B"), Catch::Contains("not a qwen3 flavor") && Catch::Contains("0.6B"));
  CHECK_THROWS_WITH(model_flavor("gpt2", "debugmodel"), Catch::Contains("model.name 'gpt2'") && Catch::Contains("qwen3"));
}

TEST_CASE("a Qwen3 flavor keeps the Hub checkpoints' 151,936 embedding rows for a tokenizer that fits", "[model]") {
  // Qwen3's tokenizer has 151,669 tokens; its published embeddings and lm_head have 151,936 rows.
  CHECK(titan::model::trained_model_args("qwen3", "0.6B", 151669).vocab_size == 151936);
  CHECK(titan::model::trained_model_args("qwen3", "30B-A3B", 151669).vocab_size == 151936);
  CHECK(titan::model::trained_model_args("qwen3", "8B", 200000).vocab_size == 200000);  // a larger tokenizer: its own
  // The debug flavors and Llama 3 take the tokenizer's size, as before.
  CHECK(titan::model::trained_model_args("qwen3", "debugmodel_moe_small", 258).vocab_size == 258);
  CHECK(titan::model::trained_model_args("llama3", "8B", 128256).vocab_size == 128256);
}
