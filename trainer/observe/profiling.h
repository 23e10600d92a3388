// trainer/observe/profiling.h — profiler traces and memory snapshots at chosen steps (torchtitan's
// [profiling] section).
//
// Every profile_freq steps (torch.profiler's schedule: profiler_warmup steps prepared, then the
// profiler_active steps ending at step % profile_freq == 0)
//   traced:      Kineto (LibTorch's profiler) over the active steps, saved as Chrome-trace JSON
//                dump_folder/save_traces_folder/iteration_N/rank{R}_trace.json (Perfetto and
//                chrome://tracing open it); each step is a ProfilerStep#N range, titan's
//                NamedScopes are user ranges, and "distributedInfo" names rank, world size and
//                backend as PyTorch's profiler writes it (Holistic Trace Analysis reads it);
//   snapshotted: dump_folder/save_memory_snapshot_folder/iteration_N/rank{R}_memory_snapshot
//                .pickle (+ .html on the CPU) at the end of the step, covering that step.
// One frequency drives both, as in torchtitan. On an out-of-memory error the trainer calls
// on_out_of_memory(), which writes iteration_N_exit/ (torchtitan's name) before it exits.
#pragma once

#include <c10/core/Device.h>

namespace at {
struct RecordFunction;
}

#include <cstdint>
#include <memory>
#include <string>

#include "trainer/config/job_config.h"

namespace titan::trainer::observe {

class StepProfiler {
 public:
  StepProfiler(const config::ProfilingSection& cfg, const std::string& dump_folder, int rank,
               c10::Device device);
  ~StepProfiler();

  void step_begin(int64_t step);
  void step_end(int64_t step);
  // Writes the exit snapshot of `step` (if snapshots are on); never throws.
  void on_out_of_memory(int64_t step) noexcept;

  bool snapshots_enabled() const { return cfg_.enable_memory_snapshot; }

 private:
  bool due(int64_t step) const { return step % cfg_.profile_freq == 0; }
  int cycle_position(int64_t step) const;  // 1..profile_freq
  std::string snapshot_dir(const std::string& iteration) const;

  config::ProfilingSection cfg_;
  std::string dump_folder_;
  int rank_;
  c10::Device device_;
  bool tracing_ = false;   // recording (active steps)
  bool prepared_ = false;  // warmup: prepared, not recording
  std::unique_ptr<at::RecordFunction> step_range_;  // ProfilerStep#N of the current step
};

}  // namespace titan::trainer::observe
