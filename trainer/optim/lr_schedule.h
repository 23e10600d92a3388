// trainer/optim/lr_schedule.h — the phase lengths of torchtitan's warmup-stable-decay LR schedule.
//
// Header-only and free of LibTorch so that both the config checks (titan_config, which warns
// when a phase is clamped) and the schedule itself (LrSchedule in optimizer.h) use one
// computation. Follows torchtitan 0.2.x's build_lr_schedulers
// (torchtitan/components/lr_scheduler.py, checked against release v0.2.2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace titan::trainer::optim {

struct LrPhases {
  int64_t warmup = 0;  // after clamping to training.steps
  int64_t stable = 0;  // includes one virtual extra step, so the last real step's LR is not 0
  int64_t decay = 0;   // after clamping to training.steps - warmup
  bool warmup_clamped = false;  // lr_scheduler.warmup_steps > training.steps
  bool decay_clamped = false;   // warmup + round(steps x decay_ratio) > training.steps
  int64_t requested_decay = 0;  // round(steps x decay_ratio) before clamping
};

// Python's round(): halves go to the even neighbour (round(2.5) == 2), unlike std::llround.
// torchtitan computes decay_steps with it, so e.g. 10 steps x decay_ratio 0.25 decay for 2 steps.
inline int64_t round_half_to_even(double x) {
  const double lower = std::floor(x);
  const double fraction = x - lower;
  int64_t rounded = static_cast<int64_t>(lower);
  if (fraction > 0.5 || (fraction == 0.5 && rounded % 2 != 0)) ++rounded;
  return rounded;
}

// decay_ratio < 0 stands for torchtitan's None: decay over every step after warmup.
inline LrPhases lr_phases(int64_t training_steps, int64_t warmup_steps, double decay_ratio) {
  LrPhases phases;
  phases.warmup_clamped = warmup_steps > training_steps;
  phases.warmup = std::min(warmup_steps, training_steps);
  phases.decay = training_steps - phases.warmup;
  if (decay_ratio >= 0) {
    phases.requested_decay = round_half_to_even(static_cast<double>(training_steps) * decay_ratio);
    phases.decay_clamped = phases.warmup + phases.requested_decay > training_steps;
    phases.decay = phases.decay_clamped ? training_steps - phases.warmup : phases.requested_decay;
  }
  phases.stable = training_steps + 1 - phases.warmup - phases.decay;
  return phases;
}

}  // namespace titan::trainer::optim
