#include "trainer/observe/profiling.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "trainer/observe/memory_snapshot.h"
#include "util/atomic_file.h"
#include "util/logging.h"

// Exported by libtorch_cpu (torch/csrc/profiler/kineto_shim.h, which pulls in Kineto's own
// headers when USE_KINETO is defined): adds a top-level key to the trace JSON, as PyTorch's
// profiler does for "distributedInfo".
namespace torch::autograd::profiler {
TORCH_API void addMetadataJson(const std::string& key, const std::string& value);
}

namespace titan::trainer::observe {
namespace {

namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::set<ActivityType> activities(c10::Device device) {
  std::set<ActivityType> acts{ActivityType::CPU};
  if (device.is_cuda()) acts.insert(ActivityType::CUDA);
  return acts;
}

// Kineto writes the trace to `<name>.tmp`, renames it to `<name>` and reports a full disk only
// as a log line, leaving a truncated `.tmp` behind. So it writes under the atomic writer's
// temporary name, its own `.tmp` is removed whatever happens, and a trace that does not end
// with its closing brace (the stream stopped mid-way) counts as failed: whole or not at all.
void save_trace(kineto::ProfilerResult& result, const std::string& path) {
  std::string kineto_temp;
  try {
    util::write_file_atomic_via(
        path,
        [&](const std::string& temp) {
          kineto_temp = temp + ".tmp";
          result.save(temp);
          std::remove(kineto_temp.c_str());
        },
        [](const std::string& temp) -> std::string {
          std::ifstream in(temp, std::ios::binary | std::ios::ate);
          const std::streamoff size = in ? static_cast<std::streamoff>(in.tellg()) : -1;
          char last = 0;
          for (std::streamoff back = 1; in && back <= std::min<std::streamoff>(size, 64); ++back) {
            in.seekg(size - back);
            in.get(last);
            if (!std::isspace(static_cast<unsigned char>(last))) break;
          }
          return last == '}' ? "" : "the profiler's trace is incomplete (" + std::to_string(size) +
                                        " bytes, no closing brace): disk full or file size limit?";
        });
  } catch (...) {
    if (!kineto_temp.empty()) std::remove(kineto_temp.c_str());
    throw;
  }
}

}  // namespace

StepProfiler::StepProfiler(const config::ProfilingSection& cfg, const std::string& dump_folder, int rank,
                           c10::Device device)
    : cfg_(cfg), dump_folder_(dump_folder), rank_(rank), device_(device) {
  if (cfg_.enable_profiling && cfg_.profiler_warmup + cfg_.profiler_active > cfg_.profile_freq) {
    throw config::ConfigError(
        "profiling.profiler_warmup (" + std::to_string(cfg_.profiler_warmup) +
        ") + profiling.profiler_active (" + std::to_string(cfg_.profiler_active) +
        ") must not exceed profiling.profile_freq (" + std::to_string(cfg_.profile_freq) + ")");
  }
  if (cfg_.enable_memory_snapshot) {
    start_memory_recording(device_);
    util::log_info("memory snapshots every " + std::to_string(cfg_.profile_freq) + " steps -> " +
                   snapshot_dir("iteration_N"));
  }
  if (cfg_.enable_profiling)
    util::log_info("profiler traces every " + std::to_string(cfg_.profile_freq) + " steps -> " +
                   (std::filesystem::path(dump_folder_) / cfg_.save_traces_folder / "iteration_N").string());
}

StepProfiler::~StepProfiler() {
  step_range_.reset();
  if (tracing_) {
    try {
      kineto::disableProfiler();
    } catch (...) {
    }
  }
}

std::string StepProfiler::snapshot_dir(const std::string& iteration) const {
  return (std::filesystem::path(dump_folder_) / cfg_.save_memory_snapshot_folder / iteration).string();
}

// torch.profiler's schedule, as torchtitan sets it: in each cycle of profile_freq steps,
// wait = profile_freq - warmup - active steps untraced, `warmup` steps with the profiler
// prepared but not recording, then `active` steps recorded into one trace, saved after the
// cycle's last step (a multiple of profile_freq).
int StepProfiler::cycle_position(int64_t step) const {
  const int64_t pos = step % cfg_.profile_freq;
  return static_cast<int>(pos == 0 ? cfg_.profile_freq : pos);
}

void StepProfiler::step_begin(int64_t step) {
  // Every step restarts the allocation trace so a snapshot (or the OOM one) shows its step.
  if (cfg_.enable_memory_snapshot) restart_memory_trace(device_);
  if (!cfg_.enable_profiling) return;
  const int64_t pos = cycle_position(step);
  const int64_t first_active = cfg_.profile_freq - cfg_.profiler_active + 1;
  const int64_t first_warmup = first_active - cfg_.profiler_warmup;
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true,
                              /*profile_memory=*/false, /*with_stack=*/false);
  if (!prepared_ && pos >= first_warmup && pos < first_active) {
    kineto::prepareProfiler(config, activities(device_));
    prepared_ = true;
  }
  if (!tracing_ && pos >= first_active) {
    if (!prepared_) kineto::prepareProfiler(config, activities(device_));
    kineto::enableProfiler(config, activities(device_));
    prepared_ = false;
    tracing_ = true;
    // Which rank of how many, so that Holistic Trace Analysis sees one rank per file.
    const char* world = std::getenv("WORLD_SIZE");
    kineto::addMetadataJson(
        "distributedInfo",
        "{\"backend\": \"" + std::string(device_.is_cuda() ? "nccl" : "gloo") +
            "\", \"rank\": " + std::to_string(rank_) +
            ", \"world_size\": " + std::to_string(world ? std::atoi(world) : 1) + "}");
  }
  if (tracing_) {
    // PyTorch's profiler marks each step with a "ProfilerStep#N" user range; trace tools
    // (HTA, Perfetto queries) cut iterations on it.
    step_range_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (step_range_->isActive()) step_range_->before("ProfilerStep#" + std::to_string(step));
  }
}

void StepProfiler::step_end(int64_t step) {
  const std::string iteration = "iteration_" + std::to_string(step);
  step_range_.reset();  // ends this step's ProfilerStep#N range
  if (tracing_ && cycle_position(step) == cfg_.profile_freq) {
    tracing_ = false;
    auto result = kineto::disableProfiler();
    const auto dir = std::filesystem::path(dump_folder_) / cfg_.save_traces_folder / iteration;
    std::filesystem::create_directories(dir);
    const std::string path = (dir / ("rank" + std::to_string(rank_) + "_trace.json")).string();
    save_trace(*result, path);
    util::log_info("profiler trace of step " + std::to_string(step) + " -> " + path);
  }
  if (cfg_.enable_memory_snapshot && due(step)) {
    const std::string path =
        write_memory_snapshot(device_, snapshot_dir(iteration), rank_, "step " + std::to_string(step));
    util::log_info("memory snapshot of step " + std::to_string(step) + " -> " + path);
  }
}

void StepProfiler::on_out_of_memory(int64_t step) noexcept {
  if (!cfg_.enable_memory_snapshot) return;
  try {
    const std::string path = write_memory_snapshot(
        device_, snapshot_dir("iteration_" + std::to_string(step) + "_exit"), rank_,
        "out of memory in step " + std::to_string(step));
    util::log_error("out of memory: memory snapshot -> " + path);
  } catch (const std::exception& e) {
    util::log_error(std::string("out of memory, and writing the snapshot failed: ") + e.what());
  }
}

}  // namespace titan::trainer::observe
