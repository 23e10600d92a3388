// Qwen3-MoE (titan's small MoE flavor: 4 blocks, 8 experts, top 2) in the layouts expert
// parallelism composes with, as real titan-train ranks under titan-run: every rank's losses and
// grad norms against one process over 10 steps (tests/layout_check.h's tolerances: the same
// float32 math in another reduction order), with real routing and with the debug round-robin
// routing; each layer's expert load every step and expert_bias after the 10 steps equal.
//
// Why the load and the bias are compared exactly: the per-expert token counts are integers
// summed exactly in float32, and the bias moves by coeff * sign(mean - count); a layout that
// routed one token differently would show a different count. (A top-k near-tie flipped by a
// 1e-7 reduction-order difference could in principle do that too; the 10 steps here have none.)
#include <catch2/catch.hpp>

#include <ATen/ops/equal.h>
#include <ATen/ops/zeros.h>

#include <string>
#include <vector>

#include "tests/layout_check.h"
#include "trainer/checkpoint/manager.h"

namespace layout = titan::testing::layout;
namespace fs = std::filesystem;

namespace {

const std::string kMoe =
    "--model.name qwen3 --model.flavor debugmodel_moe_small --checkpoint.enable_checkpoint --checkpoint.interval 10 "
    "--checkpoint.no_last_save_model_only";
constexpr int kLayers = 4, kExperts = 8;

std::vector<at::Tensor> expert_biases(const fs::path& dump) {
  titan::trainer::checkpoint::CheckpointReader reader((dump / "checkpoint" / "step-10").string());
  std::vector<at::Tensor> biases;
  for (int layer = 0; layer < kLayers; ++layer) {
    at::Tensor b = at::zeros({kExperts});
    reader.read("model.layers." + std::to_string(layer) + ".moe.expert_bias", {kExperts}, {0}, b);
    biases.push_back(b);
  }
  return biases;
}

// One layout against one process with the same `extra` overrides (routing, float8): the metrics
// (layout_check), then rank 0's expert loads (every layer's: balance_experts sums over pp too) and
// every layer's expert_bias from the step-10 checkpoint.
// `float8`: only the metrics, within `tol` (a flipped e4m3 rounding can route a token elsewhere).
void check_moe_layout(const std::string& name, int nproc, const std::string& overrides, const std::string& extra,
                      const layout::Tolerance& tol = {}, bool float8 = false) {
  const std::string shared = kMoe + extra;
  layout::check_layout(name, nproc, overrides, 8, shared, tol);
  if (float8) return;
  const layout::Reference& ref = layout::reference_run(8, shared);
  const auto want = layout::expert_loads(ref.dump / "metrics.jsonl");
  const auto got = layout::expert_loads(layout::root() / name / "metrics_rank0.jsonl");
  REQUIRE(want.size() == 10);
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO(name << " step " << s + 1);
    REQUIRE(got[s].size() <= want[s].size());
    for (size_t l = 0; l < got[s].size(); ++l) CHECK(got[s][l] == want[s][l]);
  }
  const std::vector<at::Tensor> want_bias = expert_biases(ref.dump), got_bias = expert_biases(layout::root() / name);
  for (size_t l = 0; l < want_bias.size(); ++l) {
    INFO(name << " layer " << l << ": " << got_bias[l] << " vs one process " << want_bias[l]);
    CHECK(at::equal(got_bias[l], want_bias[l]));
  }
}

// A float8 layout against one process with the same recipe: only the reduction order differs,
// which after step 1 can flip an element's e4m3 rounding (2^-3 relative) and with it a token's
// routing: test_parallel's float8 layout bounds (5e-4 loss, 2e-3 grad norm), and no exact load or
// bias comparison.
layout::Tolerance float8_layout_tolerance() {
  layout::Tolerance f8;
  f8.loss = 5e-4;
  f8.grad_norm = 2e-3;
  return f8;
}

const std::vector<std::tuple<std::string, int, std::string>> kLayouts = {
    {"ep2", 2, "--parallelism.expert_parallel_degree 2"},
    {"ep4", 4, "--parallelism.expert_parallel_degree 4"},
    {"ep2_fsdp2", 4, "--parallelism.expert_parallel_degree 2"},  // dp_shard 4: experts summed over efsdp 2
    {"ep2_hsdp", 4, "--parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2"},
    {"ep2_pp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.pipeline_parallel_degree 2"},
    {"ep2_pp2_zbv", 4,  // the V schedule with the weight gradients split off
     "--parallelism.expert_parallel_degree 2 --parallelism.pipeline_parallel_degree 2 "
     "--parallelism.pipeline_parallel_schedule ZBVZeroBubble"},
    {"ep2_cp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.context_parallel_degree 2"},
    {"ep2_tp2", 4, "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2"},  // ETP 1
    {"ep2_etp2", 4,
     "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2 "
     "--parallelism.expert_tensor_parallel_degree 2"},
    {"ep2_full_ac", 2, "--parallelism.expert_parallel_degree 2 --activation_checkpoint.mode full"},
    {"ep2_tp2_op_ac", 4,  // per-op AC keeps the all-to-alls' outputs: the recompute sends nothing
     "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2 --activation_checkpoint.mode "
     "selective --activation_checkpoint.selective_ac_option op"},
    {"tp2", 2, "--parallelism.tensor_parallel_degree 2"},  // no EP: experts sharded on their hidden dim
    {"fsdp2", 2, ""},  // no EP: the experts are FSDP-sharded with the rest of their block
    {"pp2", 2, "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule Interleaved1F1B"},
};

}  // namespace

TEST_CASE("Qwen3-MoE with real routing: EP 2, EP 4, EP 2 x FSDP 2, HSDP, PP 2, CP 2, TP 2 (ETP 1, 2), full and per-op "
          "AC, and TP / FSDP / PP without EP equal one process",
          "[moe][dist]") {
  for (const auto& [name, nproc, overrides] : kLayouts) check_moe_layout(name, nproc, overrides, "");
}

TEST_CASE("Qwen3-MoE with forced load balance: EP 2, EP 2 x FSDP 2, EP 2 x CP 2, EP 2 x TP 2 equal one process",
          "[moe][dist]") {
  for (const auto& [name, nproc, overrides] : kLayouts)
    if (name == "ep2" || name == "ep2_fsdp2" || name == "ep2_cp2" || name == "ep2_tp2")
      check_moe_layout(name + "_balanced", nproc, overrides, " --model.moe_force_load_balance");
}

TEST_CASE("Qwen3-MoE with float8 dense linears: rowwise at EP 2 x FSDP 2, tensorwise at EP 2 x TP 2 equal one "
          "process with the same recipe",
          "[moe][dist][float8]") {
  // The attention linears are float8 (the router gate and the experts stay high precision: the
  // gate's 8 outputs are not a float8 GEMM shape, the experts have their own converter, off here).
  const layout::Tolerance f8 = float8_layout_tolerance();
  check_moe_layout("ep2_fsdp2_rowwise", 4, "--parallelism.expert_parallel_degree 2",
                   " --float8.enable_float8_linear --float8.recipe_name rowwise", f8, true);
  check_moe_layout("ep2_tp2_tensorwise", 4,
                   "--parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2",
                   " --float8.enable_float8_linear --float8.recipe_name tensorwise", f8, true);
}

TEST_CASE("Qwen3-MoE with float8 rowwise and MXFP8 experts: EP 2 x FSDP 2 (and with float8 dispatch), EP 2 x TP 2, TP 2 "
          "(experts sharded on their hidden dim), PP 2, EP 2 x CP 2, EP 2, EP 2 x ETP 2, EP 2 x TP 2 with per-op AC equal "
          "one process with the same recipe",
          "[moe][dist][float8]") {
  // The routed experts in low precision (quantize.grouped_mm.*), the dense linears in float32. A
  // group's scales come from the same set of rows in every layout (EP orders a group's rows by
  // source rank, which no per-row or per-column amax sees), and under TP the float8 amaxes along
  // the sharded hidden dim reduce over the group: only the reduction order differs, so the float8
  // dense-linear layouts' bounds apply (a flipped e4m3 rounding may route a token elsewhere).
  const layout::Tolerance f8 = float8_layout_tolerance();
  const std::string rowwise = " --model.converters quantize.grouped_mm.float8 --quantize.grouped_mm.float8.fqns experts";
  const std::string mxfp8 = " --model.converters quantize.grouped_mm.mx --quantize.grouped_mm.mx.fqns experts";
  for (const auto& [name, nproc, overrides] : kLayouts) {
    if (name == "ep2_fsdp2" || name == "ep2_tp2" || name == "tp2" || name == "pp2" || name == "ep2_cp2")
      check_moe_layout(name + "_rowwise_experts", nproc, overrides, rowwise, f8, true);
    if (name == "ep2" || name == "ep2_etp2" || name == "ep2_tp2_op_ac")
      check_moe_layout(name + "_mxfp8_experts", nproc, overrides, mxfp8, f8, true);
    // Float8 dispatch (EP only: one process has nothing to dispatch) against one process with the
    // same rowwise experts: the forward is the same bits; the weight gradients read the rows as
    // their float8 values (Note [Float8 dispatch]), a difference of the recipe's own size.
    if (name == "ep2_fsdp2")
      check_moe_layout(name + "_rowwise_float8_dispatch", nproc,
                       overrides + " --quantize.grouped_mm.float8.float8_dispatch", rowwise, f8, true);
  }
}

TEST_CASE("expert parallel degrees that do not fit are config errors before any process group", "[moe][dist]") {
  struct Case {
    int nproc;
    std::string overrides, error;
  };
  const std::vector<Case> cases = {
      {2, "--parallelism.expert_parallel_degree 3", "expert_parallel_degree(3) must divide the ranks it borrows"},
      {4, "--parallelism.expert_parallel_degree 4 --parallelism.data_parallel_replicate_degree 2",
       "expert_parallel_degree(4) must divide the ranks it borrows, dp_shard(2) * cp(1) = 2"},
      {3, "--parallelism.expert_parallel_degree 3 --training.global_batch_size 6",
       "parallelism.expert_parallel_degree 3 does not divide the 8 experts of model.flavor debugmodel_moe_small"},
      {2, "--parallelism.expert_parallel_degree 2 --parallelism.expert_tensor_parallel_degree 2",
       "expert_tensor_parallel_degree(2) must be 1 or tensor_parallel_degree(1)"},
      {4, "--parallelism.expert_parallel_degree 4 --parallelism.tensor_parallel_degree 2 "
          "--parallelism.expert_tensor_parallel_degree 2",
       "expert_parallel_degree(4) must divide the ranks it borrows, dp_shard(2) * cp(1) = 2"},
  };
  for (const Case& c : cases) {
    const fs::path dump = layout::root() / "bad_ep";
    const layout::Run r = layout::run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(c.nproc) +
                                              " -- " + TITAN_TRAIN_PATH + " " + layout::train_args(dump) + " " + kMoe +
                                              " " + c.overrides,
                                          dump.string() + ".log");
    INFO(c.overrides << ":\n" << r.log);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.log, Catch::Matchers::Contains(c.error));
    CHECK_THAT(r.log, !Catch::Matchers::Contains("gloo"));  // refused before any process group
  }
}

TEST_CASE("Qwen3 with a tied embedding under FSDP 2 (with validation), HSDP 2 x 2, TP 2 (loss parallel and not), "
          "FSDP 2 x TP 2 and replicated data parallel 2 equals one process",
          "[moe][dist]") {
  // The output reads the embedding's weight: under TP both shard the vocabulary rows alike, so the
  // tied weight's gradient sums the embedding's and the output's on each rank's rows (every
  // gradient checked element by element in tests/test_moe_tp_grads.cpp); under FSDP the
  // embedding's group stays gathered until the output's backward and reduce-scatters after both
  // gradients arrived (FsdpParamSpec::uses).
  // The layouts' tolerances (reduction order only). On torchtitan's debugmodel (16 heads of 128:
  // q 2048 wide on a width of 256) TP 2's grad norm moved by up to 1.2e-5 over 10 steps from
  // reduction order alone; this small flavor (4 heads of 32) stays within the default 1e-5.
  const std::string tied = "--model.name qwen3 --model.flavor debugmodel_small";
  const layout::Tolerance tp_tol;
  layout::check_layout("qwen3_tied_tp2", 2, "--parallelism.tensor_parallel_degree 2", 8, tied, tp_tol);
  layout::check_layout("qwen3_tied_tp2_no_loss_parallel", 2,
                       "--parallelism.tensor_parallel_degree 2 --parallelism.disable_loss_parallel", 8, tied, tp_tol);
  layout::check_layout("qwen3_tied_fsdp2", 2, "--parallelism.data_parallel_shard_degree 2", 8, tied, tp_tol);
  layout::check_layout("qwen3_tied_hsdp", 4,
                       "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 2", 8,
                       tied, tp_tol);
  layout::check_layout("qwen3_tied_fsdp2_tp2", 4,
                       "--parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2", 8, tied,
                       tp_tol);
  // Validation (no autograd) reshards every group when the forward ends, the tied one included
  // once the output read it: one process and FSDP 2 see the same 2 validation rows.
  const std::string validation =
      " --validation.enable --validation.dataset fortunes --validation.freq 5 --validation.steps 2"
      " --validation.seq_len 32 --validation.local_batch_size 2";
  layout::check_layout("qwen3_tied_fsdp2_validation", 2,
                       "--parallelism.data_parallel_shard_degree 2 --validation.local_batch_size 1", 8,
                       tied + validation, tp_tol);
  const std::vector<double> want =
      layout::validation_losses(layout::reference_run(8, tied + validation).dump / "metrics.jsonl");
  const std::vector<double> got =
      layout::validation_losses(layout::root() / "qwen3_tied_fsdp2_validation" / "metrics_rank0.jsonl");
  REQUIRE(want.size() == 2);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(layout::kLossRelTol));
  layout::check_layout("qwen3_tied_replicate2", 2,
                       "--parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1", 8,
                       tied);
}

TEST_CASE("Qwen3 with a tied embedding across pipeline stages: PP 2 (1F1B: two ranks' copies; ZBV: one rank holds "
          "both), PP 2 x FSDP 2, PP 2 x TP 2 equal one process",
          "[moe][dist][pipeline]") {
  // Note [Tied embedding across stages]: the first and the last stage's ranks each hold the
  // embedding and sum their gradients once per step; ZBV's V puts both stages on pp rank 0, one
  // tensor as in one process. Same tolerance as the other tied layouts (reduction order only).
  const std::string tied = "--model.name qwen3 --model.flavor debugmodel_small";
  const layout::Tolerance tol;  // See the tied FSDP / TP case above
  layout::check_layout("qwen3_tied_pp2", 2, "--parallelism.pipeline_parallel_degree 2", 8, tied, tol);
  layout::check_layout("qwen3_tied_pp2_zbv", 2,
                       "--parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_schedule ZBVZeroBubble",
                       8, tied, tol);
  layout::check_layout("qwen3_tied_pp2_fsdp2", 4,
                       "--parallelism.pipeline_parallel_degree 2 --parallelism.data_parallel_shard_degree 2", 8, tied,
                       tol);
  layout::check_layout("qwen3_tied_pp2_tp2", 4,
                       "--parallelism.pipeline_parallel_degree 2 --parallelism.tensor_parallel_degree 2", 8, tied, tol);
}
