#include "trainer/profiling.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>

#include "trainer/logging.h"
#include "trainer/memory_snapshot.h"

namespace titan::trainer {
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

}  // namespace

StepProfiler::StepProfiler(const ProfilingSection& cfg, const std::string& dump_folder, int rank,
                           c10::Device device)
    : cfg_(cfg), dump_folder_(dump_folder), rank_(rank), device_(device) {
  if (cfg_.enable_memory_snapshot) {
    start_memory_recording(device_);
    log_info("memory snapshots every " + std::to_string(cfg_.profile_freq) + " steps -> " +
             snapshot_dir("iteration_N"));
  }
  if (cfg_.enable_profiling)
    log_info("profiler traces every " + std::to_string(cfg_.profile_freq) + " steps -> " +
             (std::filesystem::path(dump_folder_) / cfg_.save_traces_folder / "iteration_N").string());
}

StepProfiler::~StepProfiler() {
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

void StepProfiler::step_begin(int64_t step) {
  // Every step restarts the allocation trace so a snapshot (or the OOM one) shows its step.
  if (cfg_.enable_memory_snapshot) restart_memory_trace(device_);
  if (cfg_.enable_profiling && due(step)) {
    const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true,
                                /*profile_memory=*/false, /*with_stack=*/false);
    kineto::prepareProfiler(config, activities(device_));
    kineto::enableProfiler(config, activities(device_));
    tracing_ = true;
  }
}

void StepProfiler::step_end(int64_t step) {
  const std::string iteration = "iteration_" + std::to_string(step);
  if (tracing_) {
    tracing_ = false;
    auto result = kineto::disableProfiler();
    const auto dir = std::filesystem::path(dump_folder_) / cfg_.save_traces_folder / iteration;
    std::filesystem::create_directories(dir);
    const std::string path = (dir / ("rank" + std::to_string(rank_) + "_trace.json")).string();
    result->save(path);
    log_info("profiler trace of step " + std::to_string(step) + " -> " + path);
  }
  if (cfg_.enable_memory_snapshot && due(step)) {
    const std::string path =
        write_memory_snapshot(device_, snapshot_dir(iteration), rank_, "step " + std::to_string(step));
    log_info("memory snapshot of step " + std::to_string(step) + " -> " + path);
  }
}

void StepProfiler::on_out_of_memory(int64_t step) noexcept {
  if (!cfg_.enable_memory_snapshot) return;
  try {
    const std::string path = write_memory_snapshot(
        device_, snapshot_dir("iteration_" + std::to_string(step) + "_exit"), rank_,
        "out of memory in step " + std::to_string(step));
    log_error("out of memory: memory snapshot -> " + path);
  } catch (const std::exception& e) {
    log_error(std::string("out of memory, and writing the snapshot failed: ") + e.what());
  }
}

}  // namespace titan::trainer
