// trainer/fault_injection.h — faults on purpose, for the fault tests, at a step boundary.
//
// comm.debug_fail_at_step / debug_fail_rank: that rank throws as the step starts (its peers then
// fail in their next collective, naming it). comm.debug_stall_at_step / debug_stall_rank: that
// rank stops (sleeps an hour) as the step starts, so its peers' next collective times out and the
// flight recorder names it. The training loop calls before_step() between steps; the step itself
// knows nothing of this. All off (step 0) by default.
#pragma once

#include <cstdint>

#include "trainer/config/job_config.h"

namespace titan::trainer {

class FaultInjection {
 public:
  // Throws config::ConfigError when a fault is on for a rank that is not in the job.
  FaultInjection(const config::CommSection& comm, int rank, int world_size);
  // Throws (fail) or never returns in time (stall) when `step` is this rank's fault step.
  void before_step(int64_t step) const;

 private:
  config::CommSection comm_;
  int rank_;
};

}  // namespace titan::trainer
