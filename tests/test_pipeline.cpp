// Pipeline parallelism end to end: real titan-train ranks under titan-run, every schedule at PP 2
// and PP 4 (and a CSV schedule), composed with FSDP, TP, async TP, float8 and activation
// checkpointing, checked against the single-process run with the same global batch and the same
// micro-batches (tests/layout_check.h); the pipeline keys' config errors.
//
// Exactness: a schedule whose stages run their backwards in micro-batch order accumulates every
// gradient in the order the one-process run accumulates its micro-batches, and each stage runs
// the very operations the one-process model runs (a stage boundary only detaches the hidden
// states and hands their gradient back), so the losses are identical to the bit. The grad norm
// adds the per-rank sums of squares in another order (an all-reduce of float64 partial sums):
// a few float64 ulps, bounded here by 1e-12 relative. LoopedBFS runs the backwards in reverse
// micro-batch order, so its float32 gradient sums differ by reduction order (the layout
// tolerance, 1e-5).
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/job_runs.h"
#include "tests/layout_check.h"

using namespace titan::testing::layout;
using Catch::Matchers::Contains;

namespace {

// PP over `pp` ranks: the local batch (8 rows) is the global batch; micro-batches of 2 rows, as
// the reference's gradient accumulation (train_args: local batch 2, global batch 8).
std::string pp_args(int pp, const std::string& schedule) {
  return "--parallelism.pipeline_parallel_degree " + std::to_string(pp) +
         " --parallelism.data_parallel_shard_degree 1 --training.local_batch_size 8"
         " --parallelism.pipeline_parallel_microbatch_size 2 --parallelism.pipeline_parallel_schedule " +
         schedule;
}

// The runs whose losses must equal the reference's exactly (See the note at the top).
// 5 steps instead of the harness's 10 (the reference runs them too): the layouts differ from the
// first step on if at all, and CI time goes to the number of runs.
const std::string kSteps = " --training.steps 5";

// `shared`: overrides the reference runs too (a low-precision recipe).
void check_bitwise_pp(const std::string& name, int nproc, const std::string& overrides,
                      const std::string& shared = "") {
  Tolerance exact;
  exact.loss = 0;
  exact.first_loss = 0;
  exact.grad_norm = 1e-12;
  check_layout(name, nproc, overrides, 8, shared + kSteps, exact);
}

// Within the layout tolerance (tests/layout_check.h), over the same 5 steps.
void check_pp(const std::string& name, int nproc, const std::string& overrides, const std::string& shared = "",
              const Tolerance& tol = {}) {
  check_layout(name, nproc, overrides, 8, shared + kSteps, tol);
}

}  // namespace

TEST_CASE("PP 2: every schedule reproduces the single-process run", "[parallel][dist][pipeline]") {
  for (const char* schedule : {"GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"})
    check_bitwise_pp(std::string("pp2_") + schedule, 2, pp_args(2, schedule));
  check_pp("pp2_LoopedBFS", 2, pp_args(2, "LoopedBFS"));
  // Gradient accumulation on top: two passes of 2 micro-batches (local batch 4, global 8).
  check_bitwise_pp("pp2_1F1B_accumulation", 2, pp_args(2, "1F1B") + " --training.local_batch_size 4");
}

TEST_CASE("PP 4: single-stage and interleaved and V schedules reproduce the single-process run",
          "[parallel][dist][pipeline]") {
  // debugmodel: 6 layers + embedding + output = 8 effective layers, 4 stages (1F1B, GPipe) or 8.
  for (const char* schedule : {"1F1B", "GPipe", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"})
    check_bitwise_pp(std::string("pp4_") + schedule, 4, pp_args(4, schedule));
  check_pp("pp4_LoopedBFS", 4, pp_args(4, "LoopedBFS"));
}

TEST_CASE("PP 2: the FLOP-balanced split (V-shaped and looped) reproduces the single-process run",
          "[parallel][dist][pipeline]") {
  // Note [Stage split by FLOPs]: ZBV's rank 0 then holds layers 0-1 and 5 with the output, rank 1
  // layers 2-4 (torchtitan's split: 0 and 5, against 1-4).
  const std::string flops = " --parallelism.pipeline_parallel_stage_balance flops";
  check_bitwise_pp("pp2_ZBV_flops", 2, pp_args(2, "ZBVZeroBubble") + flops);
  check_bitwise_pp("pp2_Interleaved1F1B_flops", 2, pp_args(2, "Interleaved1F1B") + flops);
}

TEST_CASE("PP 2 with block-causal attention: 1F1B and ZBV reproduce the single-process run bitwise",
          "[parallel][dist][pipeline][documents]") {
  // Every stage finds its micro-batch's documents from the step's tokens, which every pipeline
  // rank holds; later stages attend per document over the hidden states they receive.
  const std::string block = "--model.attn_mask_type block_causal";
  check_bitwise_pp("pp2_1F1B_block_causal", 2, pp_args(2, "1F1B"), block);
  check_bitwise_pp("pp2_ZBV_block_causal", 2, pp_args(2, "ZBVZeroBubble"), block);
}

TEST_CASE("PP 2: a schedule from a CSV file runs as written", "[parallel][dist][pipeline]") {
  // torchtitan's format: one row per rank; GPipe written by hand with idle cells.
  const fs::path csv = root() / "gpipe_by_hand.csv";
  std::ofstream(csv) << "0F0,0F1,0F2,0F3,,,0B0,0B1,0B2,0B3\n,1F0,1F1,1F2,1F3,1B0,1B1,1B2,1B3,\n";
  check_bitwise_pp("pp2_csv", 2, pp_args(2, "GPipe") + " --parallelism.pipeline_parallel_schedule_csv " + csv.string());
}

TEST_CASE("PP 2 composes with FSDP and TP and async TP and activation checkpointing", "[parallel][dist][pipeline]") {
  // FSDP under PP reduce-scatters once per step (the reference: once per micro-batch), TP sums in
  // another order: the layout tolerance.
  check_pp("pp2_fsdp2", 4, pp_args(2, "1F1B") + " --parallelism.data_parallel_shard_degree 2"
                            " --training.local_batch_size 4");
  check_pp("pp2_tp2", 4, pp_args(2, "Interleaved1F1B") + " --parallelism.tensor_parallel_degree 2");
  check_pp("pp2_async_tp2_zb", 4, pp_args(2, "InterleavedZeroBubble") +
                                     " --parallelism.tensor_parallel_degree 2"
                                     " --parallelism.enable_async_tensor_parallel");
  // Under AC the zero-bubble I runs the whole backward: still exact.
  check_bitwise_pp("pp2_zbv_full_ac", 2, pp_args(2, "ZBVZeroBubble") + " --activation_checkpoint.mode full");
  // Replicas (HSDP's outer dimension; the shard dimension is pp2_fsdp2's): 4 ranks.
  check_pp("pp2_replicate2", 4, pp_args(2, "1F1B") + " --parallelism.data_parallel_replicate_degree 2"
                                " --training.local_batch_size 4");
  // int8 and delayed float8 scaling (one amax-history update per step, over all ranks): exact too.
  check_bitwise_pp("pp2_int8", 2, pp_args(2, "1F1B"), "--int8.enable_int8_linear");
  check_bitwise_pp("pp2_float8_delayed", 2, pp_args(2, "Interleaved1F1B"),
                   "--float8.enable_float8_linear --float8.recipe_name tensorwise_delayed");
}

TEST_CASE("the weights exported from a pipelined run are the single-process run's", "[parallel][dist][pipeline]") {
  // Each parameter is gathered on its stage and broadcast over pp to rank 0; after 3 identical
  // steps the files hold the same bytes.
  std::string exported[2];
  for (int pp : {1, 2}) {
    const fs::path dump = root() / ("pp_export_" + std::to_string(pp));
    const std::string path = (dump / "weights.safetensors").string();
    const std::string args = train_args(dump, 8, 3) + " --checkpoint.export_path " + path;
    const Run r = pp == 1 ? run_job(std::string(TITAN_TRAIN_PATH) + " " + args, dump.string() + ".log")
                          : run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " + TITAN_TRAIN_PATH + " " +
                                        args + " " + pp_args(2, "ZBVZeroBubble"),
                                    dump.string() + ".log");
    INFO(r.log);
    REQUIRE(r.exit_code == 0);
    std::ifstream in(path, std::ios::binary);
    exported[pp - 1].assign(std::istreambuf_iterator<char>(in), {});
  }
  CHECK(exported[0].size() > 1000000);
  CHECK(exported[0] == exported[1]);
}

TEST_CASE("PP 2 x FSDP 2 x TP 2 with float8 rowwise and per-op AC reproduces the float8 run",
          "[parallel][dist][pipeline][float8]") {
  // As in test_parallel's float8 layouts: later steps inherit reduction-order differences that
  // can flip an e4m3 rounding (2^-3 relative per element); measured 2.5e-5 loss and 1.2e-4 grad
  // norm relative over 10 steps, the same as FSDP 2 x TP 2 without PP (5 run here).
  Tolerance f8;
  f8.loss = 5e-4;
  f8.grad_norm = 2e-3;
  const std::string float8 = "--float8.enable_float8_linear --float8.recipe_name rowwise "
                             "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op";
  check_pp("pp2_fsdp2_tp2_float8", 8,
           pp_args(2, "1F1B") + " --parallelism.data_parallel_shard_degree 2 --parallelism.tensor_parallel_degree 2"
                                " --training.local_batch_size 4",
           float8, f8);
}

TEST_CASE("impossible pipeline configs end before any process group and name the keys", "[parallel][dist][pipeline]") {
  const fs::path dir = root() / "pp_bad";
  fs::create_directories(dir);
  const fs::path twice = dir / "stage_twice.csv", backward_first = dir / "backward_first.csv";
  std::ofstream(twice) << "0F0,1F0,0B0,1B0\n1F0,1B0,,\n";  // stage 1 on both ranks
  std::ofstream(backward_first) << "0F0,0B0\n1B0,1F0\n";   // 1B0 before 1F0
  struct Bad {
    const char* what;
    std::string overrides;
    std::string message;
    std::string key = "parallelism.pipeline_parallel_schedule";  // the key the message names
  };
  const std::vector<Bad> rows = {
      {"an unknown schedule", pp_args(2, "Zigzag"), "unknown pipeline schedule 'Zigzag' (valid: GPipe, 1F1B, Interleaved1F1B"},
      {"DualPipeV", pp_args(2, "DualPipeV"), "DualPipeV"},
      {"a microbatch size that does not divide the local batch",
       pp_args(2, "1F1B") + " --parallelism.pipeline_parallel_microbatch_size 3",
       "training.local_batch_size (8) must be divisible by parallelism.pipeline_parallel_microbatch_size (3)",
       "training.local_batch_size"},
      {"1F1B with fewer micro-batches than stages",
       pp_args(2, "1F1B") + " --training.local_batch_size 2 --training.global_batch_size 2",
       "the number of microbatches (1) must be greater than or equal to the number of stages (2)"},
      {"Interleaved1F1B with a micro-batch count not a multiple of its rounds",
       pp_args(2, "Interleaved1F1B") + " --training.local_batch_size 10 --training.global_batch_size 10",
       "multiple of the number of rounds"},
      {"ZBVZeroBubble with four stages per rank",
       pp_args(2, "ZBVZeroBubble") + " --parallelism.pipeline_parallel_layers_per_stage 1", "stages per rank",
       "parallelism.pipeline_parallel_layers_per_stage 1"},
      {"a FLOP-balanced split with split points",
       pp_args(2, "1F1B") + " --parallelism.pipeline_parallel_stage_balance flops"
                           " --parallelism.pipeline_parallel_split_points layers.3",
       "computes the split; it cannot be combined with parallelism.pipeline_parallel_split_points",
       "parallelism.pipeline_parallel_stage_balance"},
      {"norm and output on different stages",
       pp_args(2, "1F1B") + " --parallelism.module_fqns_per_model_part "
                           "'tok_embeddings layers.0 layers.1 layers.2 layers.3 layers.4 layers.5 norm,output'",
       "holds norm but not output", "parallelism.module_fqns_per_model_part"},
      {"a CSV that puts a stage on two ranks",
       pp_args(2, "1F1B") + " --parallelism.pipeline_parallel_schedule_csv " + twice.string(), "1F0: runs a second time",
       "parallelism.pipeline_parallel_schedule_csv"},
      {"a CSV with a backward before its forward",
       pp_args(2, "1F1B") + " --parallelism.pipeline_parallel_schedule_csv " + backward_first.string(),
       "1B0: a backward of stage 1, micro-batch 0 without first running its forward",
       "parallelism.pipeline_parallel_schedule_csv"},
      {"a CSV that does not exist",
       pp_args(2, "1F1B") + " --parallelism.pipeline_parallel_schedule_csv " + (dir / "missing.csv").string(),
       "missing.csv' does not exist", "parallelism.pipeline_parallel_schedule_csv"},
  };
  int n = 0;
  for (const Bad& row : rows) {
    const fs::path dump = dir / ("row" + std::to_string(n++));
    const Run r = run_job("timeout -s KILL 120 " + std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " +
                              TITAN_TRAIN_PATH + " " + train_args(dump) + " " + row.overrides,
                          dump.string() + ".log");
    INFO(row.what << ":\n" << r.log);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.log, Contains(row.message));
    CHECK_THAT(r.log, Contains("bad config: pipeline parallel: ") && Contains(row.key));
    CHECK_THAT(r.log, !Contains("distributed: "));  // no rank got as far as the process group
  }
}

TEST_CASE("a stage that stalls mid-step ends the job naming the stage and the action waited on",
          "[parallel][dist][pipeline]") {
  // Rank 1 (stage 1) sleeps at the start of step 3; rank 0 has sent its activations and waits for
  // the first gradient back, until comm.train_timeout_seconds (3 s).
  const fs::path dump = root() / "pp_stall";
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node 2 -- " + TITAN_TRAIN_PATH + " " +
                            train_args(dump, 8, 1000) + " " + pp_args(2, "1F1B") +
                            " --comm.debug_stall_rank 1 --comm.debug_stall_at_step 3 --comm.train_timeout_seconds 3",
                        dump.string() + ".log");
  INFO(r.log);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.log, Contains("pipeline: pp rank 0 (global rank 0), stage 0, action 0B0: waiting for the gradient of "
                             "micro-batch 0 from stage 1 (pp rank 1) failed") &&
                        Contains("timed out"));
  CHECK_THAT(r.log, Contains("titan-run: FAILED: rank 0"));
  CHECK(r.seconds < 90);  // 1000 steps would take many minutes; the timeout is 3 s
}

// Each pp rank's estimate (`--estimate-memory` prints one report per rank; Note [Pipeline
// memory] in trainer/observe/memory_estimate.cpp) against the tracked allocator's peak of a
// steady-state step of that rank (the run's last). The bound is the estimator's own 15% (its
// per-block terms against single-process peaks, docs/memory.md); below the measurement by more
// than 5% (allocator rounding) it must not go, since an estimate that says "fits" must fit.
void check_pipeline_memory(const std::string& name, int pp, const std::string& args) {
  const fs::path dump = root() / name;  // `args` write their metrics there (train_args)
  const std::string& run_args = args;
  const Run estimate = run_job("WORLD_SIZE=" + std::to_string(pp) + " " + std::string(TITAN_TRAIN_PATH) +
                                   " --estimate-memory " + run_args,
                               dump.string() + "_estimate.log");
  INFO(estimate.log);
  REQUIRE(estimate.exit_code == 0);
  std::vector<double> estimated;  // bytes per pp rank, in rank order
  std::istringstream lines(estimate.log);
  for (std::string line; std::getline(lines, line);)
    if (line.find("total (peak)") != std::string::npos)
      estimated.push_back(std::stod(line.substr(line.rfind('(') + 1)));
  REQUIRE(estimated.size() == static_cast<size_t>(pp));
  const Run r = run_job(std::string(TITAN_RUN_PATH) + " --nproc-per-node " + std::to_string(pp) + " -- " +
                            TITAN_TRAIN_PATH + " " + run_args,
                        dump.string() + ".log");
  INFO(r.log);
  REQUIRE(r.exit_code == 0);
  for (int rank = 0; rank < pp; ++rank) {
    const auto rows = titan::testing::read_metrics_lines(dump / ("metrics_rank" + std::to_string(rank) + ".jsonl"));
    const double measured = rows.back().at("memory_peak_bytes").get<double>();
    INFO(name << " pp rank " << rank << ": estimate " << estimated[rank] / double(1 << 20) << " MiB, measured "
              << measured / double(1 << 20) << " MiB");
    CHECK(estimated[rank] >= 0.95 * measured);
    CHECK(estimated[rank] <= 1.15 * measured);
  }
}

TEST_CASE("the memory estimate follows each pipeline stage: GPipe holds every micro-batch, 1F1B at most p, ZBV its "
          "deferred weight gradients too",
          "[parallel][dist][pipeline][memory]") {
  // ZBVZeroBubble: two stages per rank, and between each I and its W the deferred weight
  // gradients' operands (Note [Deferred weight gradients]) on top of the micro-batch's graph.
  // ZBV under the FLOP-balanced split too (Note [Stage split by FLOPs]): rank 0 takes a block from rank 1.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"GPipe", ""}, {"1F1B", ""}, {"ZBVZeroBubble", ""},
      {"ZBVZeroBubble", " --parallelism.pipeline_parallel_stage_balance flops"}};
  for (const auto& [schedule, split] : cases) {
    const std::string name = "pp_memory_" + schedule + (split.empty() ? "" : "_flops");
    check_pipeline_memory(name, 2, train_args(root() / name, 8, 3) + " " + pp_args(2, schedule) + split +
                                       " --training.seq_len 128");
  }
}

TEST_CASE("the memory estimate follows deep and interleaved pipelines: PP 4 over 16 micro-batches, PP 8 over 32, "
          "every schedule",
          "[parallel][dist][pipeline][memory]") {
  // debugmodel with 16 layers: a block per stage at PP 8 with two stages per rank. Micro-batches
  // of one row of 128 tokens, so the sends between stages (Note [Retiring sends]) and the posted
  // receives weigh as much against a stage's activations as they do at scale.
  for (int pp : {4, 8}) {
    const int microbatches = 4 * pp;
    for (const char* schedule :
         {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"}) {
      const std::string name = "pp" + std::to_string(pp) + "_memory_" + schedule;
      check_pipeline_memory(
          name, pp,
          train_args(root() / name, microbatches, 3) + " --model.flavor debugmodel_16layers --training.seq_len 128" +
              " --parallelism.pipeline_parallel_degree " + std::to_string(pp) +
              " --parallelism.data_parallel_shard_degree 1 --training.local_batch_size " +
              std::to_string(microbatches) + " --parallelism.pipeline_parallel_microbatch_size 1" +
              " --parallelism.pipeline_parallel_schedule " + schedule);
    }
  }
}
