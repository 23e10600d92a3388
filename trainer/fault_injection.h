// trainer/fault_injection.h — faults on purpose, for the fault tests, at a step boundary.
//
// comm.debug_fail_at_step / debug_fail_rank: that rank throws as the step starts (its peers then
// fail in their next collective, naming it). comm.debug_stall_at_step / debug_stall_rank: that
// rank stops (sleeps an hour) as the step starts, so its peers' next collective times out and the
// flight recorder names it. comm.debug_slow_seconds / debug_slow_rank: that rank sleeps that long
// as every step starts, a straggler (Note [Straggler report]). training.debug_nonfinite_at_step:
// after that step's backward every rank's first non-empty gradient is filled with NaN, so the
// step's non-finite check fires (Note [Non-finite steps]) with the step's other state (MoE token
// counts, float8 amaxes) as a real overflow leaves it. All off (step 0) by default, and then
// nothing of this exists in the run: the Trainer installs a hook only when a fault is asked for,
// and its step runs whatever hooks were installed (none in production).
#pragma once

#include <cstdint>
#include <functional>

#include "trainer/config/job_config.h"

namespace titan::parallel {
class ParallelModel;
}

namespace titan::trainer {

// The hook to run before each step when `comm` asks for a fault on some rank, else an empty
// function. It throws (fail) or does not return in time (stall) at this rank's fault step.
// Throws config::ConfigError when a fault is on for a rank that is not in the job.
std::function<void(int64_t step)> fault_injection_hook(const config::CommSection& comm, int rank, int world_size);

// The hook to run after each step's backward when training.debug_nonfinite_at_step is set, else
// an empty function: at that step it fills this rank's first non-empty gradient with NaN.
std::function<void(int64_t step)> nonfinite_gradient_hook(int64_t at_step, parallel::ParallelModel& model);

}  // namespace titan::trainer
