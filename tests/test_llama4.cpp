// The Llama 4 family (model.name = llama4): titan's Transformer with MoE blocks every
// interleave_moe_layer_step blocks (a shared expert, top-1 sigmoid routing before the experts),
// Llama 3.1 rope scaling and iRoPE (NoPE blocks over the whole window, RoPE blocks within chunks)
// against torchtitan 0.2.2's own llama4 Transformer on the same weights and tokens
// (tests/fixtures/torchtitan/v0.2.2/llama4_model.json, written by
// scripts/reference/torchtitan_llama4.py, which runs the release's model.py, moe.py and the mask
// mods of its attention.py).
//
// Tolerance: as tests/test_qwen3.cpp's: both run float32 over the same operations with different
// kernels (fused RMSNorm and CPU flash attention, per document or chunk, vs torch's composites and
// a dense-masked softmax), so sums are reordered through four blocks; the rotary frequencies are
// computed in float64 here, in float32 by torchtitan. 1e-5 of the largest logit (and of each
// gradient's norm times the projection vector's norm) is ~10x what such reorderings give, while a
// chunk boundary in the wrong place, RoPE on a NoPE block or a dense block built as MoE is off by
// O(1).
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "model/attention_masks.h"
#include "model/document_attention.h"
#include "model/flavors.h"
#include "model/llama4/args.h"
#include "model/transformer.h"
#include "tests/torchtitan_model_fixture.h"

using namespace titan::model;
using titan::model::llama4::Llama4Args;

namespace {

ModelArgs fixture_args(const nlohmann::json& fixture, const nlohmann::json& c) {
  const nlohmann::json& shapes = fixture.at("shapes");
  const nlohmann::json& scaling = fixture.at("rope_scaling");
  ModelArgs a = model_flavor("llama4", "debugmodel");
  a.vocab_size = shapes.at("vocab_size");
  a.dim = shapes.at("dim");
  a.n_layers = shapes.at("n_layers");
  a.n_heads = shapes.at("n_heads");
  a.n_kv_heads = shapes.at("n_kv_heads");
  a.multiple_of = shapes.at("multiple_of");
  a.norm_eps = shapes.at("norm_eps");
  a.rope_theta = shapes.at("rope_theta");
  a.max_seq_len = shapes.at("max_seq_len");
  a.rope_scaling.enabled = true;
  a.rope_scaling.factor = scaling.at("scaling_factor");
  a.rope_scaling.low_freq_factor = scaling.at("low_freq_factor");
  a.rope_scaling.high_freq_factor = scaling.at("high_freq_factor");
  a.rope_scaling.original_max_position_embeddings = scaling.at("original_max_position_embeddings");
  a.block_causal = c.at("attn_mask_type") == "block_causal";
  a.eos_id = fixture.at("eos_id");
  a.moe->num_experts = fixture.at("num_experts");
  // torchtitan's auto-scaled expert size: int(2 * 4 dim / 3) / (top_k + shared), up to multiple_of.
  a.moe_hidden_dim = 48;
  auto l4 = std::make_shared<Llama4Args>();
  l4->interleave_moe_layer_step = c.at("interleave_moe_layer_step");
  l4->every_n_layers_nope = c.at("every_n_layers_nope");
  l4->fixed_attn_block_size = c.at("fixed_attn_block_size");
  a.family_args = l4;
  return a;
}

}  // namespace

TEST_CASE("Llama 4 (MoE every block or every second, shared expert, top-1 sigmoid before the experts, iRoPE chunks, "
          "block-causal and causal) equals torchtitan 0.2.2's llama4 Transformer",
          "[model][llama4]") {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  REQUIRE(src != nullptr);  // ctest sets it
  std::ifstream in(std::filesystem::path(src) / "tests/fixtures/torchtitan/v0.2.2/llama4_model.json");
  REQUIRE(in.good());
  const nlohmann::json fixture = nlohmann::json::parse(in);
  for (const nlohmann::json& c : fixture.at("cases")) {
    INFO("case " << c.at("name").get<std::string>());
    const ModelArgs a = fixture_args(fixture, c);
    Transformer model(a);
    const titan::testing::FixtureRun run = titan::testing::check_model_against_fixture(model, fixture, c, 1e-5);
    int64_t numel = 0;
    for (const auto& [fqn, p] : run.params) numel += p->numel();
    CHECK(count_params(a).total == numel);
    // The same blocks are MoE, with the same routing decisions.
    const std::vector<int64_t> moe_layers = c.at("moe_layers");
    const std::vector<std::vector<float>> counts = c.at("tokens_per_expert");
    size_t moe_block = 0;
    for (TransformerBlock* block : model.blocks()) {
      const bool moe = std::find(moe_layers.begin(), moe_layers.end(), block->layer_id) != moe_layers.end();
      CHECK((block->moe != nullptr) == moe);
      if (block->moe) CHECK(at::equal(block->moe->tokens_per_expert, at::tensor(counts.at(moe_block++))));
    }
    CHECK(moe_block == counts.size());
  }
}

TEST_CASE("chunked documents split every document at the chunk boundaries of the row; the mfu's attention share "
          "counts each layer's own mask",
          "[model][llama4]") {
  // Row 0: documents [0, 6) and [6, 12); row 1: one document. Chunks of 4: [0, 4) [4, 8) [8, 12).
  const at::Tensor docs = at::tensor(std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0,
                                                          0, 0, 0, 0, 0})
                              .view({2, 12});
  const std::vector<std::vector<DocumentSpan>> spans = document_spans(chunked_documents(docs, 4));
  REQUIRE(spans.size() == 2);
  const std::vector<std::pair<int64_t, int64_t>> row0 = {{0, 4}, {4, 2}, {6, 2}, {8, 4}};
  REQUIRE(spans[0].size() == row0.size());
  for (size_t i = 0; i < row0.size(); ++i) CHECK((spans[0][i].start == row0[i].first && spans[0][i].length == row0[i].second));
  REQUIRE(spans[1].size() == 3);
  for (const DocumentSpan& s : spans[1]) CHECK(s.length == 4);
  CHECK(at::equal(chunked_documents(docs, 12), docs));  // one chunk: the documents themselves
  // debugmodel_irope: 6 layers, NoPE blocks 0 and 4 over the whole (block-causal) window, RoPE
  // blocks 1-3 and 5 within chunks of 256; at seq 1024 with no EOS, a NoPE block computes the
  // causal square (1024 x 1025 pairs) and a chunked one 4 chunks of 256 x 257: the mfu's share is
  // (2 + 4 x 4 x 256 x 257 / (1024 x 1025)) / 6.
  ModelArgs irope = model_flavor("llama4", "debugmodel_irope");
  irope.eos_id = 1;
  CHECK(uses_row_documents(irope));
  const at::Tensor tokens = at::full({1, 1024}, 7, at::kLong);
  const double chunked = 4.0 * 256 * 257 / (1024.0 * 1025.0);
  CHECK(attention_work(irope, tokens) == Approx((2 + 4 * chunked) / 6).epsilon(1e-12));
  // Causal without iRoPE: the whole square, and no documents.
  const ModelArgs plain = model_flavor("llama4", "debugmodel");
  CHECK_FALSE(uses_row_documents(plain));
  CHECK(attention_work(plain, tokens) == 1.0);
  // iRoPE under a causal mask: the rows are one document each, split at the chunks.
  ModelArgs causal_irope = irope;
  causal_irope.block_causal = false;
  CHECK(uses_row_documents(causal_irope));
  CHECK(row_documents(causal_irope, tokens).sum().item<int64_t>() == 0);
  CHECK(attention_work(causal_irope, tokens) == Approx((2 + 4 * chunked) / 6).epsilon(1e-12));
}

TEST_CASE("Llama 4 flavors: torchtitan's shapes, interleaved MoE blocks, iRoPE layers, parameter counts",
          "[model][llama4]") {
  const ModelArgs scout = model_flavor("llama4", "17bx16e");
  CHECK((scout.dim == 5120 && scout.n_layers == 48 && scout.n_heads == 40 && scout.kv_heads() == 8 &&
         scout.vocab_size == 202048 && scout.moe_hidden_dim == 8192 && scout.moe->num_experts == 16 &&
         scout.moe->top_k == 1 && scout.moe->num_shared_experts == 1 && scout.moe->score_before_experts &&
         scout.rope_scaling.enabled && scout.rope_scaling.factor == 16.0));
  const ModelArgs maverick = model_flavor("llama4", "17bx128e");
  CHECK((maverick.moe->num_experts == 128 && maverick.ffn_hidden_dim() == 16384 && !maverick.rope_scaling.enabled));
  const Family& f = family("llama4");
  // Scout: every block MoE; Maverick: MoE in the odd blocks (interleave 2), dense between.
  for (int64_t layer = 0; layer < 48; ++layer) {
    CHECK(f.feed_forward(scout, layer) == FeedForwardKind::kMoE);
    CHECK(f.feed_forward(maverick, layer) == (layer % 2 == 1 ? FeedForwardKind::kMoE : FeedForwardKind::kDense));
  }
  // Meta's published sizes: Scout 109B parameters, Maverick 400B, 17B active per token each.
  const ParamCount scout_count = count_params(scout), maverick_count = count_params(maverick);
  CHECK(std::abs(static_cast<double>(scout_count.total) / 1e9 - 109.0) < 2.0);
  CHECK(std::abs(static_cast<double>(maverick_count.total) / 1e9 - 400.0) < 4.0);
  CHECK(std::abs(static_cast<double>(scout_count.active) / 1e9 - 17.0) < 1.0);
  CHECK(std::abs(static_cast<double>(maverick_count.active) / 1e9 - 17.0) < 1.0);
  // iRoPE: every 4th block from 0 NoPE (no chunk), the others chunked at 8192 (256 in debugmodel_irope).
  const ModelArgs irope = model_flavor("llama4", "17bx16e_irope");
  CHECK(irope.block_causal);
  for (int64_t layer = 0; layer < 8; ++layer) CHECK(f.attention_chunk(irope, layer) == (layer % 4 == 0 ? 0 : 8192));
  CHECK(f.attention_chunk(model_flavor("llama4", "debugmodel_irope"), 1) == 256);
  CHECK(f.attention_chunk(scout, 1) == 0);
  for (const char* name : {"debugmodel", "17bx16e", "17bx128e", "debugmodel_irope", "17bx16e_irope", "17bx128e_irope"})
    CHECK_NOTHROW(model_flavor("llama4", name));
  CHECK_THROWS_WITH(model_flavor("llama4", "8B"), Catch::Contains("not a llama4 flavor") &&
                                                      Catch::Contains("17bx128e_irope"));
}
