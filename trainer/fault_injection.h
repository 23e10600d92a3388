// trainer/fault_injection.h — faults on purpose, for the fault tests, at a step boundary.
//
// comm.debug_fail_at_step / debug_fail_rank: that rank throws as the step starts (its peers then
// fail in their next collective, naming it). comm.debug_stall_at_step / debug_stall_rank: that
// rank stops (sleeps an hour) as the step starts, so its peers' next collective times out and the
// flight recorder names it. comm.debug_slow_seconds / debug_slow_rank: that rank sleeps that long
// as every step starts, a straggler (Note [Straggler report]). All off (step 0) by default, and then nothing of this exists in the
// run: the Trainer installs the hook only when a fault is asked for, and its loop runs whatever
// hooks were installed (none in production); the step itself knows nothing of this.
#pragma once

#include <cstdint>
#include <functional>

#include "trainer/config/job_config.h"

namespace titan::trainer {

// The hook to run before each step when `comm` asks for a fault on some rank, else an empty
// function. It throws (fail) or does not return in time (stall) at this rank's fault step.
// Throws config::ConfigError when a fault is on for a rank that is not in the job.
std::function<void(int64_t step)> fault_injection_hook(const config::CommSection& comm, int rank, int world_size);

}  // namespace titan::trainer
