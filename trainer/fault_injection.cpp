// trainer/fault_injection.cpp — see fault_injection.h.
#include "trainer/fault_injection.h"

#include <ATen/core/grad_mode.h>

#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "parallel/parallel_model.h"
#include "util/logging.h"

namespace titan::trainer {

std::function<void(int64_t)> fault_injection_hook(const config::CommSection& comm, int rank, int world_size) {
  auto check = [&](int64_t at_step, int64_t fault_rank, const char* key) {
    if (at_step > 0 && fault_rank >= world_size)
      throw config::ConfigError(std::string(key) + " = " + std::to_string(fault_rank) +
                                " is not a rank of this job: must be in [0, " + std::to_string(world_size - 1) +
                                "] (WORLD_SIZE " + std::to_string(world_size) + ")");
  };
  check(comm.debug_fail_at_step, comm.debug_fail_rank, "comm.debug_fail_rank");
  check(comm.debug_stall_at_step, comm.debug_stall_rank, "comm.debug_stall_rank");
  if (comm.debug_slow_seconds > 0 && comm.debug_slow_rank >= world_size)
    throw config::ConfigError("comm.debug_slow_rank = " + std::to_string(comm.debug_slow_rank) +
                              " is not a rank of this job: must be in [0, " + std::to_string(world_size - 1) +
                              "] (WORLD_SIZE " + std::to_string(world_size) + ")");
  const int64_t fail_at = comm.debug_fail_rank == rank ? comm.debug_fail_at_step : 0;
  const int64_t stall_at = comm.debug_stall_rank == rank ? comm.debug_stall_at_step : 0;
  const double slow = comm.debug_slow_rank == rank ? comm.debug_slow_seconds : 0;
  if (fail_at <= 0 && stall_at <= 0 && slow <= 0) return {};
  return [rank, fail_at, stall_at, slow](int64_t step) {
    if (slow > 0) std::this_thread::sleep_for(std::chrono::duration<double>(slow));  // a slow host
    if (step == fail_at)
      throw std::runtime_error("rank " + std::to_string(rank) + " fails on purpose at step " + std::to_string(step) +
                               " (comm.debug_fail_at_step)");
    if (step == stall_at) {
      // A rank that stops, for the flight-recorder tests: the others time out in the next collective.
      util::log_warn("rank " + std::to_string(rank) + " stalls on purpose at step " + std::to_string(step) +
                     " (comm.debug_stall_at_step)");
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
  };
}

std::function<void(int64_t)> nonfinite_gradient_hook(int64_t at_step, parallel::ParallelModel& model) {
  if (at_step <= 0) return {};
  return [at_step, &model](int64_t step) {
    if (step != at_step) return;
    util::log_warn("step " + std::to_string(step) + ": this rank's first gradient is set to NaN on purpose "
                   "(training.debug_nonfinite_at_step)");
    at::NoGradGuard no_grad;
    // Every rank poisons its own: under pp or with FSDP padding a rank may hold no element of a
    // given parameter, and the norm's all-reduce carries any one NaN to every rank.
    for (size_t i = 0; i < model.master_params().size(); ++i) {
      at::Tensor grad = model.gradient(i);
      if (!grad.defined() || grad.numel() == 0) continue;
      grad.fill_(std::numeric_limits<double>::quiet_NaN());
      return;
    }
  };
}

}  // namespace titan::trainer
