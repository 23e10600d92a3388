// DeepSeek-V3 (titan's small flavor: a dense block, then 3 MoE blocks of 8 experts, top 2 of a
// group-limited sigmoid router; latent attention with q through its rank) in every layout, as
// real titan-train ranks under titan-run: every rank's losses and grad norms against one
// process over 10 steps (tests/layout_check.h's tolerances: the same float32 math in another
// reduction order), and each MoE layer's expert load every step equal.
//
// Why the load is compared exactly: per-expert token counts are integers summed exactly; a
// layout that routed one token differently would show a different count.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include "tests/layout_check.h"

namespace layout = titan::testing::layout;
namespace fs = std::filesystem;

namespace {

const std::string kDeepSeek = "--model.name deepseek_v3 --model.flavor debugmodel_small";

// Layout `name` equals the one-process reference of `shared` (tests/layout_check.h), and its
// rank 0 logged the reference's expert load in every MoE layer at every step.
void check_layout_and_loads(const std::string& name, int nproc, const std::string& overrides, const std::string& shared,
                            const std::vector<std::vector<double>>& want) {
  layout::check_layout(name, nproc, overrides, 8, shared);
  const auto got = layout::expert_loads(layout::root() / name / "metrics_rank0.jsonl");
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO(name << " step " << s + 1);
    CHECK(got[s] == want[s]);
  }
}

}  // namespace

TEST_CASE("DeepSeek-V3 under FSDP 2, TP 2, EP 2, EP 2 x TP 2, PP 2 (1F1B, ZBV), CP 2 and FSDP 2 + per-op AC equals "
          "one process",
          "[moe][dist][deepseek_v3]") {
  const std::vector<std::tuple<std::string, int, std::string>> layouts = {
      {"ds3_fsdp2", 2, ""},
      {"ds3_tp2", 2, "--parallelism.tensor_parallel_degree 2"},  // MLA's plan: wq_b, wkv_b by head
      {"ds3_ep2", 2, "--parallelism.expert_parallel_degree 2"},
      {"ds3_ep2_tp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2"},
      {"ds3_pp2", 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B"},
      {"ds3_pp2_zbv", 2,
       "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule ZBVZeroBubble"},
      {"ds3_cp2", 2, "--parallelism.context_parallel_degree 2"},
      {"ds3_fsdp2_op_ac", 2, "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
  };
  const layout::Reference& ref = layout::reference_run(8, kDeepSeek);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  REQUIRE(want.size() == 10);
  for (const auto& [name, nproc, overrides] : layouts) check_layout_and_loads(name, nproc, overrides, kDeepSeek, want);
}

TEST_CASE("DeepSeek-V3 under HSDP 2 x 2 and async TP 2 equals one process; float8 tensorwise (TP 2, FSDP 2) and "
          "MXFP8 (TP 2) on its dense linears equal one process with the same recipe; validation under FSDP 2 (with MTP)",
          "[moe][dist][deepseek_v3][float8]") {
  // HSDP: the replicas' gradient sums; async TP: MLA's gathered input and wo's reduce-scatter in
  // chunks. The layouts' tolerances; the loads exact as above.
  const layout::Reference& ref = layout::reference_run(8, kDeepSeek);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  for (const auto& [name, nproc, overrides] : std::vector<std::tuple<std::string, int, std::string>>{
           {"ds3_hsdp", 4, "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2"},
           {"ds3_tp2_async", 2, "--parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel"}})
    check_layout_and_loads(name, nproc, overrides, kDeepSeek, want);
  // float8 on the attention, shared-expert and dense-block linears (the router gate and the
  // experts stay high precision); one process runs the same recipe, so only the reduction order
  // differs, which can flip an element's e4m3 rounding and a token's routing: the float8 layout
  // bounds of the Qwen3-MoE case (5e-4 loss, 2e-3 grad norm), no load comparison.
  const std::string f8 = kDeepSeek + " --float8.enable_float8_linear --float8.recipe_name tensorwise";
  layout::Tolerance tol;
  tol.loss = 5e-4;
  tol.grad_norm = 2e-3;
  layout::check_layout("ds3_f8_tp2", 2, "--parallelism.tensor_parallel_degree 2", 8, f8, tol);
  layout::check_layout("ds3_f8_fsdp2", 2, "", 8, f8, tol);
  // MXFP8 (emulated) on the same linears at TP 2: the same kind of rounding flips, the same bound.
  const std::string mx = kDeepSeek + " --model.converters mx --mx.recipe_name mxfp8_cublas";
  layout::check_layout("ds3_mx_tp2", 2, "--parallelism.tensor_parallel_degree 2", 8, mx, tol);
  // Validation under FSDP 2 (with two multi-token prediction depths: the validation loss is the
  // training loss's, depths included): one process and FSDP 2 see the same 2 validation rows.
  const std::string validation = kDeepSeek +
                                 " --model.mtp_layers 2 --validation.enable --validation.dataset fortunes"
                                 " --validation.freq 5 --validation.steps 2 --validation.seq_len 32"
                                 " --validation.local_batch_size 2";
  layout::check_layout("ds3_mtp_fsdp2_validation", 2, "--validation.local_batch_size 1", 8, validation);
  const std::vector<double> want_validation =
      layout::validation_losses(layout::reference_run(8, validation).dump / "metrics.jsonl");
  const std::vector<double> got_validation =
      layout::validation_losses(layout::root() / "ds3_mtp_fsdp2_validation" / "metrics_rank0.jsonl");
  REQUIRE(want_validation.size() == 2);
  REQUIRE(got_validation.size() == want_validation.size());
  for (size_t i = 0; i < want_validation.size(); ++i)
    CHECK(got_validation[i] == Approx(want_validation[i]).epsilon(layout::kLossRelTol));
}

TEST_CASE("DeepSeek-V3 with float8 rowwise experts (EP 2 x TP 2, PP 2) and MXFP8 experts (EP 2) equals one process "
          "with the same recipe",
          "[moe][dist][deepseek_v3][float8]") {
  // The routed experts in low precision (quantize.grouped_mm.*), everything else in float32: the
  // float8 layout bounds above (a flipped e4m3 rounding may route a token elsewhere).
  layout::Tolerance tol;
  tol.loss = 5e-4;
  tol.grad_norm = 2e-3;
  const std::string rowwise =
      kDeepSeek + " --model.converters quantize.grouped_mm.float8 --quantize.grouped_mm.float8.fqns experts";
  layout::check_layout("ds3_ep2_tp2_rowwise_experts", 4,
                       "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2", 8, rowwise, tol);
  layout::check_layout("ds3_pp2_rowwise_experts", 2,
                       "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule 1F1B", 8,
                       rowwise, tol);
  const std::string mx = kDeepSeek + " --model.converters quantize.grouped_mm.mx --quantize.grouped_mm.mx.fqns experts";
  layout::check_layout("ds3_ep2_mxfp8_experts", 2, "--parallelism.expert_parallel_degree 2", 8, mx, tol);
}

TEST_CASE("DeepSeek-V3 with multi-token prediction (2 depths, block-causal) under FSDP 2, TP 2, EP 2 x TP 2 and "
          "FSDP 2 + per-op AC equals one process; PP and CP refuse it by name",
          "[moe][dist][deepseek_v3]") {
  // The depths' blocks are FSDP groups and TP / EP / AC blocks like the others; the embedding is
  // looked up once per depth (FSDP counts those uses), the depths' masks are cut to the sequence
  // shards under TP, and the labels roll within documents. The same tolerances as every layout:
  // reduction order only.
  const std::string mtp = kDeepSeek + " --model.mtp_layers 2 --model.attn_mask_type block_causal";
  const std::vector<std::tuple<std::string, int, std::string>> layouts = {
      {"ds3_mtp_fsdp2", 2, ""},
      {"ds3_mtp_tp2", 2, "--parallelism.tensor_parallel_degree 2"},
      {"ds3_mtp_ep2_tp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2"},
      {"ds3_mtp_fsdp2_op_ac", 2,
       "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op"},
  };
  const layout::Reference& ref = layout::reference_run(8, mtp);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  REQUIRE(want.size() == 10);
  REQUIRE(want[0].size() == 5);  // 3 MoE blocks + 2 depths
  for (const auto& [name, nproc, overrides] : layouts) check_layout_and_loads(name, nproc, overrides, mtp, want);
  const std::vector<std::tuple<int, std::string, std::string>> refused = {
      {2, "--parallelism.pipeline_parallel_degree 2", "model.mtp_layers = 2 with parallelism.pipeline_parallel_degree = 2"},
      {2, "--parallelism.context_parallel_degree 2", "model.mtp_layers = 2 with parallelism.context_parallel_degree = 2"},
  };
  for (const auto& [nproc, overrides, error] : refused) {
    const fs::path dump = layout::root() / "ds3_mtp_refused";
    const layout::Run r = layout::run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(nproc) +
                                              " -- " + TITAN_TRAIN_PATH + " " + layout::train_args(dump) + " " + mtp +
                                              " " + overrides,
                                          dump.string() + ".log");
    INFO(overrides << ":\n" << r.log);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.log, Catch::Matchers::Contains(error));
    CHECK_THAT(r.log, !Catch::Matchers::Contains("gloo"));  // refused before any process group
  }
  // The depths' loss is logged beside the loss, on every step's line and in metrics.jsonl.
  const auto lines = titan::testing::read_metrics_lines(ref.dump / "metrics.jsonl");
  REQUIRE(!lines.empty());
  for (const auto& j : lines) {
    REQUIRE(j.contains("mtp_loss"));
    CHECK(j.at("mtp_loss").get<double>() > 0);
    CHECK(j.at("mtp_loss").get<double>() < j.at("loss").get<double>());  // loss = main + 0.3 x it
  }
}
