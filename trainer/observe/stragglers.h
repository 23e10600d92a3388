// trainer/observe/stragglers.h — the slow rank, named.
//
// Note [Straggler report]: when one GPU or host runs slow, every rank waits for it at the next
// collective, and the step time alone cannot say who. What separates the slow rank is its
// compute time: the log window's wall time minus the time it sat blocked inside collectives
// (the mesh's exposed seconds): the others wait for it, so their blocked time grows and their
// compute stays put, while its own compute grows. At each log step the ranks all-gather
// (compute seconds, node) — one small collective, only at log steps and only when
// metrics.straggler_factor is on — and every rank sees every rank's figure: the slowest is
// named when it exceeds the median rank's by the factor.
#pragma once

#include <string>
#include <vector>

namespace titan::parallel::comm {
class Comm;
}

namespace titan::trainer::observe {

struct StragglerReport {
  std::vector<double> compute_seconds;  // per global rank, this window
  std::vector<int> nodes;               // per global rank, its node (GROUP_RANK)
  double median = 0;                    // of compute_seconds
  int slowest_rank = -1;
  double ratio = 0;                     // slowest / median
  bool named = false;                   // ratio > the factor
  // "straggler: rank 3 (node 1) computed 2.41 s in this window, 2.10x the median 1.15 s of 4 ranks"
  std::string describe() const;
};

class StragglerDetector {
 public:
  // `world`: every rank (not null); `node`: this rank's node index; `factor` > 1.
  StragglerDetector(parallel::comm::Comm& world, int node, double factor);
  // Collective over the world, at the same log steps on every rank.
  StragglerReport observe(double compute_seconds);

 private:
  parallel::comm::Comm& world_;
  int node_;
  double factor_;
};

}  // namespace titan::trainer::observe
