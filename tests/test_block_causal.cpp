// Block-causal attention in the trained model (model.attn_mask_type = block_causal and torchtitan's
// *_flex_attn / *_varlen_attn / *_flex / *_varlen flavors): documents found from the byte
// tokenizer's EOS (257), attention confined to each (model/document_attention.h).
#include <ATen/core/grad_mode.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "model/flavors.h"
#include "parallel/comm/mesh.h"
#include "tests/job_runs.h"
#include "tests/temp_dir.h"
#include "trainer/config/job_config.h"
#include "trainer/config/parallel_options.h"
#include "trainer/train.h"

using namespace titan::trainer;
using namespace titan::trainer::config;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kEos = 257;  // the byte-level tokenizer's EOS

// Each job its own dump folder (its metrics.jsonl is read back).
JobConfig job(const std::vector<std::string>& extra) {
  static int jobs = 0;
  const std::string dump = titan::testing::fresh_temp_dir("test_block_causal_" + std::to_string(jobs++)).string();
  std::vector<std::string> args = {"--training.seq_len", "64", "--training.local_batch_size", "2",
                                   "--training.steps", "2", "--training.seed", "5", "--job.dump_folder", dump};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

// Byte tokens of `text` (ids 0..255), then EOS when `eos`.
std::vector<int64_t> document(const std::string& text, bool eos) {
  std::vector<int64_t> t(text.begin(), text.end());
  if (eos) t.push_back(kEos);
  return t;
}

at::Tensor row(const std::vector<std::vector<int64_t>>& documents) {
  std::vector<int64_t> flat;
  for (const auto& d : documents) flat.insert(flat.end(), d.begin(), d.end());
  return at::tensor(flat, at::kLong).view({1, -1});
}

}  // namespace

TEST_CASE("block-causal: each document of a packed row gives the logits it gives alone", "[trainer][documents]") {
  Trainer trainer(job({"--model.attn_mask_type", "block_causal"}));
  auto& model = trainer.model();
  const std::vector<std::vector<int64_t>> docs = {document("A fortune for you.", true), document("Hm.", true),
                                                  document("Tails without an EOS", false)};
  at::NoGradGuard no_grad;
  const at::Tensor packed = model.forward(row(docs), model.rope_table());  // [1, S, V]
  int64_t start = 0;
  double worst = 0;
  for (const auto& d : docs) {
    const int64_t n = static_cast<int64_t>(d.size());
    const at::Tensor alone = model.forward(row({d}), model.rope_table());
    const at::Tensor part = packed.narrow(1, start, n);
    // The document alone sits at positions 0.. instead of `start`..: RoPE is relative, so the
    // attention scores agree up to float32 rounding of the rotations (a few ulp of each q.k
    // term), carried through 6 layers: measured max |diff| / max |logit| = 2.7e-7; 3e-6 is 10x that.
    const double scale = at::abs(alone).max().item<double>();
    worst = std::max(worst, at::abs(part - alone).max().item<double>() / scale);
    start += n;
  }
  INFO("worst relative logit difference " << worst);
  CHECK(worst <= 3e-6);
  // Against causal attention over the whole row the later documents differ at the first order.
  Trainer causal(job({}));
  const at::Tensor across = causal.model().forward(row(docs), causal.model().rope_table());
  CHECK(at::abs(across - packed).max().item<double>() > 1e-3);
}

TEST_CASE("block-causal on rows of one document is causal attention, bit for bit; the flavors equal the key",
          "[trainer][documents][slow]") {
  const JobConfig block_job = job({"--model.attn_mask_type", "block_causal"}), causal_job = job({});
  Trainer block(block_job), causal(causal_job);
  {
    at::NoGradGuard no_grad;
    const at::Tensor one = row({document("A single document with no end in the row", false)});
    CHECK(at::equal(block.model().forward(one, block.model().rope_table()),
                    causal.model().forward(one, causal.model().rope_table())));
  }
  // The default corpus packs several fortunes per row: block-causal trains differently, and
  // torchtitan's flavor names are the key on their base flavor, to the bit.
  const TrainResult b = block.train(), c = causal.train();
  Trainer flex(job({"--model.flavor", "debugmodel_flex_attn"})), varlen(job({"--model.flavor", "debugmodel_varlen_attn"}));
  const TrainResult f = flex.train(), v = varlen.train();
  REQUIRE(b.losses.size() == 2);
  CHECK(b.losses[0] != c.losses[0]);
  CHECK(f.losses == b.losses);
  CHECK(v.losses == b.losses);
  CHECK(f.grad_norms == b.grad_norms);
  // tflops counts the attention block-causal computed: per token, the dense FLOPs plus attention's
  // scaled by the batch's fraction of the causal square (< 1 on packed fortunes); causal: all of it.
  const titan::model::ModelArgs& args = block.model().args();
  const double dense = titan::model::flops_per_token(args, 64) - titan::model::attention_flops_per_token(args, 64);
  auto flops_per_token_logged = [](const JobConfig& cfg) {
    const auto lines = titan::testing::read_metrics_lines(std::filesystem::path(cfg.job.dump_folder) / "metrics.jsonl");
    REQUIRE(!lines.empty());
    // Step 1: its rows pack several fortunes (its loss differs from causal's above); a 64-token
    // row of a later step may hold a single document.
    return lines.front().at("tflops").get<double>() * 1e12 / lines.front().at("tps").get<double>();
  };
  // Both from the same logged doubles: only float64 rounding (~1e-16 relative) between them.
  CHECK(flops_per_token_logged(causal_job) == Approx(titan::model::flops_per_token(args, 64)).epsilon(1e-9));
  const double logged_block = flops_per_token_logged(block_job);
  CHECK(logged_block > dense);
  CHECK(logged_block < titan::model::flops_per_token(args, 64) * (1 - 1e-6));
}

TEST_CASE("model.attn_mask_type: a misspelt value is a config error naming the key and the choices",
          "[trainer][documents]") {
  CHECK_THROWS_WITH(job({"--model.attn_mask_type", "block_casual"}),
                    Contains("model.attn_mask_type") && Contains("block_causal") && Contains("causal"));
  // torchtitan's 8B flavors: 8B's shapes, block-causal (the debugmodel ones train in the test above).
  for (const char* flavor : {"8B_flex", "8B_varlen"}) {
    const titan::model::ModelArgs a = titan::model::model_flavor("llama3", flavor), base = titan::model::model_flavor("llama3", "8B");
    INFO(flavor);
    CHECK(a.block_causal);
    CHECK(!base.block_causal);
    CHECK((a.dim == base.dim && a.n_layers == base.n_layers && a.n_heads == base.n_heads &&
           a.n_kv_heads == base.n_kv_heads && a.ffn_hidden_dim() == base.ffn_hidden_dim() &&
           a.rope_theta == base.rope_theta && a.rope_scaling.enabled == base.rope_scaling.enabled));
  }
  // Every layout takes block-causal attention: pipeline and context parallel degrees are accepted.
  for (const char* degree : {"--parallelism.pipeline_parallel_degree", "--parallelism.context_parallel_degree"}) {
    const JobConfig cfg = job({"--model.flavor", "debugmodel_flex_attn", degree, "2"});
    const titan::parallel::comm::ParallelDims dims = parallel_dims(cfg, 2);
    CHECK_NOTHROW(parallel_options(cfg, titan::model::model_flavor(cfg.model.name, cfg.model.flavor), dims, c10::kCPU, false));
  }
}
