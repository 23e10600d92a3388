// Communication that overlaps computation: overlapped FSDP (Note [FSDP overlap] in
// parallel/fsdp.h) and async tensor parallel (Note [Async TP] in parallel/async_tp.h).
//
// What is checked:
//   - numbers: overlapped FSDP equals blocking FSDP bit for bit (same math, same order); async
//     TP equals synchronous TP within float32 reduction order for float32 runs (each GEMM runs
//     on a chunk's rows, the weight gradient is a sum of chunk products: measured <= 6e-8
//     relative over 6 steps, bound 1e-5 as the other layout tests), and within float8
//     tolerance for float8 runs, whose dynamic scales of a tensor split by chunks (the output
//     gradient's, for the backward GEMMs) are computed per chunk: measured 2.4e-5 loss / 8.4e-5
//     grad norm (rowwise), 1.7e-4 / 9.8e-4 (tensorwise), bounds 1e-3 / 5e-3 (one e4m3 rounding
//     step is 6%; the differences average over thousands of elements).
//   - overlap: with a simulated slower network (comm.debug_link_*, Note [Simulated link] in
//     parallel/process_group.h) a blocking collective's wait lasts at least its simulated
//     transfer, deterministically; overlapped, compute runs during that time. So the time the
//     training thread spends blocked in collectives (comm_exposed_s) must fall, i.e. the step
//     takes less than its compute plus the communication. The margins are loose (FSDP: at least
//     10% less, measured 21-44%; async TP: 5%, measured 20-50%) because compute and Gloo's
//     threads on a loaded 2-core machine vary; the step time itself is logged, not asserted.
//   - memory: overlapped FSDP keeps at most two groups gathered at once (the running one and
//     the prefetched one), counted by FSDP and checked against the CPU memory tracker.
#include <catch2/catch.hpp>

#include <ATen/ops/randint.h>
#include <torch/csrc/autograd/autograd.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "model/llama.h"
#include "model/scope.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "tests/job_runs.h"
#include "tests/rank_threads.h"
#include "tests/temp_dir.h"
#include "trainer/memory.h"

#if !defined(TITAN_RUN_PATH) || !defined(TITAN_TRAIN_PATH)
#error "TITAN_RUN_PATH and TITAN_TRAIN_PATH must be defined by the build"
#endif

namespace fs = std::filesystem;
namespace tp = titan::parallel;

namespace {

struct Summary {
  std::vector<double> loss, grad_norm;
  double exposed_s = 0, elapsed_s = 0;  // summed over steps 2.. (step 1 includes start-up)
};

// `nproc` ranks of the debug model for 6 steps; rank 0's metrics.
Summary train(const std::string& name, int nproc, const std::string& overrides,
              const std::string& shape = "--training.seq_len 32 --training.local_batch_size 2 "
                                         "--training.global_batch_size 8") {
  const fs::path dump = titan::testing::fresh_temp_dir("test_overlap_" + name);
  std::ostringstream cmd;
  cmd << TITAN_RUN_PATH << " --nproc-per-node " << nproc << " -- " << TITAN_TRAIN_PATH << " " << shape
      << " --training.steps 6 --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 --training.num_threads 1"
      << " --metrics.peak_flops 1e12 --training.seed 3 --job.dump_folder " << dump.string() << " "
      << overrides;
  const titan::testing::JobRun r = titan::testing::run_job(cmd.str(), dump.string() + ".log");
  INFO(name << ": " << cmd.str() << "\n" << r.log);
  REQUIRE(r.exit_code == 0);
  Summary s;
  const auto lines = titan::testing::read_metrics_lines(dump / "metrics_rank0.jsonl");
  for (size_t i = 0; i < lines.size(); ++i) {
    s.loss.push_back(lines[i].at("loss").get<double>());
    s.grad_norm.push_back(lines[i].at("grad_norm").get<double>());
    if (i == 0) continue;
    s.exposed_s += lines[i].at("comm_exposed_s").get<double>();
    s.elapsed_s += lines[i].at("elapsed_s").get<double>();
  }
  return s;
}

void check_close(const std::string& what, const Summary& got, const Summary& want, double loss_tol,
                 double grad_norm_tol) {
  REQUIRE(got.loss.size() == want.loss.size());
  double worst = 0;
  for (size_t s = 0; s < got.loss.size(); ++s) {
    INFO(what << ", step " << s + 1);
    CHECK(got.loss[s] == Approx(want.loss[s]).epsilon(loss_tol));
    CHECK(got.grad_norm[s] == Approx(want.grad_norm[s]).epsilon(grad_norm_tol));
    worst = std::max(worst, std::abs(got.loss[s] - want.loss[s]) / want.loss[s]);
  }
  WARN(what << ": max relative loss difference " << worst);
}

const std::string kTp2 = "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 1";
const std::string kAsync = " --parallelism.enable_async_tensor_parallel";

}  // namespace

TEST_CASE("overlapped FSDP keeps at most two groups gathered (threads, memory tracker)", "[overlap]") {
  using namespace titan;
  trainer::install_cpu_memory_tracker();
  trainer::restart_memory_trace(c10::kCPU);
  trainer::set_cpu_memory_recording(true);
  model::ModelArgs args = model::llama3_flavor("debugmodel");
  args.vocab_size = 256;
  args.max_seq_len = 16;
  std::vector<int> max_gathered(2);
  std::vector<int64_t> group_bytes(2);
  const auto errors = testing::run_ranks_on_threads(
      2, std::chrono::milliseconds(30000), [&](int rank, const c10::intrusive_ptr<c10d::Store>& store) {
        tp::CommOptions opts;
        opts.timeout = std::chrono::milliseconds(30000);
        tp::DeviceMesh mesh(std::make_unique<tp::Comm>(store, rank, 2, "world", opts),
                            tp::resolve_parallel_dims(1, 2, 1, 1, 1, 2));
        model::Llama model(args);
        tp::ParallelOptions o;
        o.reshard_after_forward = "always";
        o.seq_len = 16;
        auto pm = tp::parallelize_llama(model, mesh, o);
        pm->init_weights(1);
        at::manual_seed(rank);
        at::Tensor tokens = at::randint(args.vocab_size, {2, 16}), labels = at::randint(args.vocab_size, {2, 16});
        at::Tensor loss = pm->loss_sum(model.forward(tokens), labels);
        torch::autograd::backward({loss});
        pm->after_backward();
        max_gathered[static_cast<size_t>(rank)] = pm->fsdp()->max_groups_gathered();
        group_bytes[static_cast<size_t>(rank)] = pm->fsdp()->unsharded_bytes_max();
      });
  trainer::set_cpu_memory_recording(false);
  for (size_t rank = 0; rank < errors.size(); ++rank) {
    INFO("rank " << rank << ": " << errors[rank]);
    REQUIRE(errors[rank].empty());
    CHECK(max_gathered[rank] == 2);  // the running group and the prefetched one, never more
  }
  // The tracker's view: gathered parameters and all-gather buffers are filed as communication.
  // Per rank at most: the running group gathered + the next one's buffer in flight (2 groups),
  // this rank's shard copy being sent (1/2 group), and the full-size copy Gloo's CPU all-gather
  // stages internally for the one in flight (1 group) and its reduce-scatter emulation (an
  // all-reduce of a full-size copy, 1 group): 4.5 groups a rank, measured 8 for both ranks.
  const trainer::MemoryRecord record = trainer::memory_record(c10::kCPU);
  const auto comm = static_cast<uint8_t>(model::MemoryCategory::kCommunication);
  std::map<uintptr_t, int64_t> comm_blocks;  // live communication allocations by address
  int64_t live = 0, peak = 0;
  for (const auto& e : record.events) {
    if (e.action == trainer::MemoryEvent::kAlloc && e.category == comm) {
      comm_blocks[e.addr] = e.size;
      live += e.size;
    } else if (e.action == trainer::MemoryEvent::kFree) {
      auto it = comm_blocks.find(e.addr);
      if (it == comm_blocks.end()) continue;
      live -= it->second;
      comm_blocks.erase(it);
    }
    peak = std::max(peak, live);
  }
  INFO("peak communication bytes " << peak << ", largest gathered group " << group_bytes[0]);
  CHECK(peak > group_bytes[0]);                        // the gathers were recorded at all
  CHECK(peak <= 2 * (4 * group_bytes[0] + group_bytes[0] / 2));
}

TEST_CASE("overlapped FSDP: the same numbers as blocking FSDP, with less exposed communication",
          "[overlap][dist]") {
  const std::string fsdp = "--parallelism.data_parallel_shard_degree 2 --comm.debug_link_bytes_per_second 1e9";
  const Summary blocking = train("fsdp2_blocking", 2, fsdp + " --parallelism.fsdp_overlap false");
  const Summary overlapped = train("fsdp2_overlapped", 2, fsdp);
  CHECK(overlapped.loss == blocking.loss);  // bit for bit: the same math in the same order
  CHECK(overlapped.grad_norm == blocking.grad_norm);
  WARN("FSDP 2, simulated 1 GB/s link, steps 2-6: exposed communication " << blocking.exposed_s << " s blocking, "
       << overlapped.exposed_s << " s overlapped; step time " << blocking.elapsed_s << " s vs " << overlapped.elapsed_s);
  // Step time below compute + communication: the overlapped step's compute (its step time minus
  // its exposed communication) plus the communication a blocking step shows exceeds its step
  // time exactly when less communication is exposed.
  CHECK(overlapped.exposed_s < 0.9 * blocking.exposed_s);
}

TEST_CASE("async TP: the synchronous TP losses (float32, TP 2 and 4, FSDP 2 x TP 2 with per-op AC)",
          "[overlap][dist]") {
  check_close("TP 2 async vs sync", train("tp2_async", 2, kTp2 + kAsync), train("tp2_sync", 2, kTp2), 1e-5, 1e-5);
  const std::string tp4 = "--parallelism.tensor_parallel_degree 4 --parallelism.data_parallel_shard_degree 1";
  check_close("TP 4 async vs sync", train("tp4_async", 4, tp4 + kAsync), train("tp4_sync", 4, tp4), 1e-5, 1e-5);
  const std::string f2t2 = "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2"
                           " --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op";
  check_close("FSDP 2 x TP 2 per-op AC async vs sync", train("f2t2_async", 4, f2t2 + kAsync),
              train("f2t2_sync", 4, f2t2), 1e-5, 1e-5);
}

TEST_CASE("async TP with float8: rowwise + full AC (3-D activation scales), tensorwise, int8",
          "[overlap][dist][float8]") {
  // The seed of this test: async TP + float8 rowwise + full activation checkpointing once
  // crashed torchtitan because a (B, S, K) activation's rowwise scale had been flattened.
  const std::string rowwise = " --float8.enable_float8_linear --float8.recipe_name rowwise --activation_checkpoint.mode full";
  check_close("TP 2 float8 rowwise full AC async vs sync", train("rowwise_async", 2, kTp2 + rowwise + kAsync),
              train("rowwise_sync", 2, kTp2 + rowwise), 1e-3, 5e-3);
  const std::string tensorwise = " --float8.enable_float8_linear --float8.recipe_name tensorwise";
  check_close("TP 2 float8 tensorwise async vs sync", train("tensorwise_async", 2, kTp2 + tensorwise + kAsync),
              train("tensorwise_sync", 2, kTp2 + tensorwise), 1e-3, 5e-3);
  const std::string int8 = " --int8.enable_int8_linear";
  check_close("TP 2 int8 async vs sync", train("int8_async", 2, kTp2 + int8 + kAsync),
              train("int8_sync", 2, kTp2 + int8), 1e-3, 5e-3);
}

TEST_CASE("async TP hides communication behind the chunks' GEMMs", "[overlap][dist]") {
  // A simulated 100 MB/s link makes each module's gather / reduce-scatter last a few ms; a
  // larger batch gives the chunks' GEMMs time to hide it.
  const std::string shape = "--training.seq_len 128 --training.local_batch_size 8 --training.global_batch_size 8";
  const std::string tp = kTp2 + " --comm.debug_link_bytes_per_second 1e8 --parallelism.async_tp_chunks 4";
  const Summary sync = train("tp2_link_sync", 2, tp, shape);
  const Summary async = train("tp2_link_async", 2, tp + kAsync, shape);
  WARN("TP 2, simulated 100 MB/s link, steps 2-6: exposed communication " << sync.exposed_s << " s sync, "
       << async.exposed_s << " s async; step time " << sync.elapsed_s << " s vs " << async.elapsed_s);
  CHECK(async.exposed_s < 0.95 * sync.exposed_s);
}
