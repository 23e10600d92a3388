// Memory you can see: CPU snapshots in PyTorch's pickle layout (read back by Python's pickle and
// PyTorch's viewer), the HTML picture, the out-of-memory path (a small limit writes the exit
// snapshot), and the estimator against the measured CPU peak for every AC mode.
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/scope.h"
#include "tests/temp_dir.h"
#include "trainer/config/job_config.h"
#include "trainer/observe/memory.h"
#include "trainer/observe/memory_estimate.h"
#include "trainer/observe/memory_snapshot.h"
#include "trainer/train.h"

using namespace titan::trainer;
using namespace titan::trainer::config;
using namespace titan::trainer::observe;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return titan::testing::fresh_temp_dir("test_memory_" + name); }

std::string python() {
  const char* src = std::getenv("TITAN_SOURCE_DIR");
  return std::string(src ? src : ".") + "/.deps/venv/bin/python";
}

int run(const std::string& cmd) { return std::system((cmd + " > /dev/null 2>&1").c_str()); }

JobConfig debug_job(const fs::path& dump, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--training.seq_len", "128", "--training.local_batch_size", "4",
                                   "--training.steps", "2", "--metrics.log_freq", "1",
                                   "--training.seed", "1", "--job.dump_folder", dump.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return parse_job_config(args);
}

// memory_peak_bytes of the last metrics line (the tracked allocator's peak of that step).
int64_t last_logged_peak(const fs::path& dump) {
  std::ifstream f(dump / "metrics.jsonl");
  std::string line, last;
  while (std::getline(f, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last).at("memory_peak_bytes").get<int64_t>();
}

}  // namespace

TEST_CASE("a CPU snapshot is PyTorch's pickle layout and Python reads it", "[memory][slow]") {
  install_cpu_memory_tracker();
  set_cpu_memory_recording(true);
  at::Tensor kept;
  {
    titan::model::NamedScope scope("forward", titan::model::MemoryCategory::kActivations);
    titan::model::NamedScope inner("layers.0");
    kept = at::ones({256, 256});
    at::Tensor freed = at::empty({1024});
  }
  const fs::path dir = temp_dir("snapshot");
  const std::string path = write_memory_snapshot(c10::kCPU, dir.string(), 0, "unit test");
  set_cpu_memory_recording(false);
  REQUIRE(fs::exists(path));
  REQUIRE(fs::exists(dir / "rank0_memory_snapshot.html"));

  const std::string check =
      python() + " -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
      "assert 'segments' in d and 'device_traces' in d; "
      "t=d['device_traces'][0]; acts={e['action'] for e in t}; "
      "assert {'alloc','free_requested','free_completed'} <= acts, acts; "
      "a=[e for e in t if e['action']=='alloc' and e['size']==256*256*4]; "
      "assert a and [f['name'] for f in a[0]['frames']]==['layers.0','forward'], a; "
      "s=[x for x in d['segments'] if x['total_size']==256*256*4]; "
      "assert s and s[0]['blocks'][0]['state']=='active_allocated', s\" " + path;
  CHECK(run(check) == 0);
  // PyTorch's own viewer turns it into its HTML timeline.
  CHECK(run(python() + " -m torch.cuda._memory_viz trace_plot " + path + " -o " +
            (dir / "viz.html").string()) == 0);
  CHECK(fs::exists(dir / "viz.html"));
  std::ifstream html(dir / "rank0_memory_snapshot.html");
  std::string text((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  CHECK(text.find("<svg") != std::string::npos);
  CHECK(text.find("activations") != std::string::npos);
  CHECK(text.find("<script") == std::string::npos);  // self-contained, no JS
}

TEST_CASE("training with snapshots writes per-step files; an OOM writes the exit snapshot", "[memory]") {
  install_cpu_memory_tracker();
  SECTION("snapshots at profile_freq") {
    const fs::path dump = temp_dir("snap_run");
    Trainer trainer(debug_job(dump, {"--training.steps", "2", "--profiling.enable_memory_snapshot",
                                     "--profiling.profile_freq", "2", "--model.flavor", "debugmodel",
                                     "--training.seq_len", "32", "--training.local_batch_size", "1"}));
    trainer.train();
    set_cpu_memory_recording(false);
    CHECK(fs::exists(dump / "memory_snapshot/iteration_2/rank0_memory_snapshot.pickle"));
    CHECK(fs::exists(dump / "memory_snapshot/iteration_2/rank0_memory_snapshot.html"));
    CHECK_FALSE(fs::exists(dump / "memory_snapshot/iteration_1"));
  }
  SECTION("out of memory") {
    const fs::path dump = temp_dir("oom_run");
    // ~100 MB of parameters + optimizer state fit; the activations of batch 8 x 256 do not.
    Trainer trainer(debug_job(dump, {"--profiling.enable_memory_snapshot",
                                     "--training.cpu_memory_limit_gib", "0.12",
                                     "--training.local_batch_size", "8", "--training.seq_len", "256"}));
    CHECK_THROWS_AS(trainer.train(), c10::OutOfMemoryError);
    set_cpu_memory_recording(false);
    set_cpu_memory_limit(0);
    const fs::path snap = dump / "memory_snapshot/iteration_1_exit/rank0_memory_snapshot.pickle";
    REQUIRE(fs::exists(snap));
    CHECK(run(python() + " -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
              "assert any(e['action']=='oom' for e in d['device_traces'][0])\" " + snap.string()) == 0);
  }
}

TEST_CASE("the estimate is within 15% of the measured CPU peak for every AC mode", "[memory][estimate][slow]") {
  install_cpu_memory_tracker();
  const std::vector<std::vector<std::string>> modes = {
      {"--activation_checkpoint.mode", "none"},
      {"--activation_checkpoint.mode", "full"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "2"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"},
  };
  for (const auto& mode : modes) {
    const fs::path dump = temp_dir("estimate");
    const JobConfig cfg = debug_job(dump, mode);
    const EstimateInputs in = estimate_inputs_from_config(cfg);
    const int64_t estimate = estimate_memory(in).total;
    {
      Trainer trainer(cfg);
      trainer.train();
    }
    const int64_t measured = last_logged_peak(dump);  // step 2: a steady-state step
    INFO(mode[1] << (mode.size() > 2 ? " " + mode[3] : "") << ": estimate " << estimate
                 << " B, measured " << measured << " B");
    CHECK(std::abs(double(estimate) - double(measured)) <= 0.15 * double(measured));
  }
}

TEST_CASE("the estimate is within 15% of the measured CPU peak for DeepSeek-V3 (latent attention, dense then MoE "
          "blocks, multi-token prediction)",
          "[memory][estimate][slow]") {
  // The attention's terms come from the family's declaration (LatentAttention::activations),
  // the blocks' feed-forward by kind: one dense block, then MoE blocks. The same 15% as the
  // dense model's: the norm and transient constants are calibrated there, not here.
  install_cpu_memory_tracker();
  const std::vector<std::vector<std::string>> modes = {
      {"--activation_checkpoint.mode", "none"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"},
      {"--activation_checkpoint.mode", "none", "--model.mtp_layers", "2"},  // two more blocks, three heads
  };
  for (std::vector<std::string> mode : modes) {
    const fs::path dump = temp_dir("estimate_ds3");
    mode.insert(mode.end(), {"--model.name", "deepseek_v3", "--model.flavor", "debugmodel"});
    const JobConfig cfg = debug_job(dump, mode);
    const EstimateInputs in = estimate_inputs_from_config(cfg);
    const int64_t estimate = estimate_memory(in).total;
    {
      Trainer trainer(cfg);
      trainer.train();
    }
    const int64_t measured = last_logged_peak(dump);
    std::string keys;
    for (const std::string& m : mode) keys += m + " ";
    INFO(keys << ": estimate " << estimate << " B, measured " << measured << " B");
    CHECK(std::abs(double(estimate) - double(measured)) <= 0.15 * double(measured));
  }
}

TEST_CASE("the estimate is within 15% of the measured CPU peak for gpt-oss (sinks, sliding windows, biased experts)",
          "[memory][estimate][slow]") {
  // Its attention's terms are grouped-query attention's (the sinks' rescale keeps one float32 row
  // of the lse per head, below a token's K/V), its experts' parameters and saved rows the
  // family's declaration (Family::routed_expert_params, routed_expert_saved_per_row: 7 H a row
  // against SwiGLU's 4 H); the same 15% as the dense model's. Measured (debugmodel, 4 x 128):
  // +3.1% without AC, +1.4% with per-op AC (with SwiGLU's 4 H: -12.4% and -3.3%).
  install_cpu_memory_tracker();
  const std::vector<std::vector<std::string>> modes = {
      {"--activation_checkpoint.mode", "none"},
      {"--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"},
  };
  for (std::vector<std::string> mode : modes) {
    const fs::path dump = temp_dir("estimate_gpt_oss");
    mode.insert(mode.end(), {"--model.name", "gpt_oss", "--model.flavor", "debugmodel"});
    const JobConfig cfg = debug_job(dump, mode);
    const EstimateInputs in = estimate_inputs_from_config(cfg);
    const int64_t estimate = estimate_memory(in).total;
    {
      Trainer trainer(cfg);
      trainer.train();
    }
    const int64_t measured = last_logged_peak(dump);
    INFO(mode[1] << ": estimate " << estimate << " B, measured " << measured << " B");
    CHECK(std::abs(double(estimate) - double(measured)) <= 0.15 * double(measured));
  }
}

TEST_CASE("large CPU storages come back from a cache by size; live bytes count them as before", "[memory]") {
  // Note [Large blocks cached by size] (trainer/observe/memory.cpp): a storage of 128 KiB or more
  // is a block of whole pages; freed, it waits for the next request of its size, so a step that
  // asks for the same sizes every step gets the same pages back (glibc's heap fragmented under
  // context parallelism until the resident set grew by 60 MB a step).
  install_cpu_memory_tracker();
  const int64_t before = memory_stats(c10::Device(c10::kCPU)).current_bytes;
  void* first = nullptr;
  {
    const at::Tensor big = at::ones({1 << 18});  // 1 MiB of float32
    first = big.data_ptr();
    CHECK(reinterpret_cast<uintptr_t>(first) % static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)) == 0);
    CHECK(memory_stats(c10::Device(c10::kCPU)).current_bytes == before + (int64_t{1} << 20));
  }
  CHECK(memory_stats(c10::Device(c10::kCPU)).current_bytes == before);
  const at::Tensor again = at::empty({1 << 18});
  CHECK(again.data_ptr() == first);  // the same pages, not faulted in again
  const at::Tensor other_size = at::ones({(1 << 18) + 4096});
  CHECK(other_size.data_ptr() != first);
  CHECK(other_size.sum().item<float>() == static_cast<float>((1 << 18) + 4096));
  // A small storage stays with the base allocator and is counted the same way.
  const at::Tensor small = at::ones({16});
  CHECK(memory_stats(c10::Device(c10::kCPU)).current_bytes ==
        before + (int64_t{1} << 20) + (((int64_t{1} << 18) + 4096) * 4) + 64);
}
