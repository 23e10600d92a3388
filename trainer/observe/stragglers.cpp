// trainer/observe/stragglers.cpp — see stragglers.h.
#include "trainer/observe/stragglers.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <cstdio>

#include "parallel/comm/process_group.h"

namespace titan::trainer::observe {

StragglerDetector::StragglerDetector(parallel::comm::Comm& world, int node, double factor)
    : world_(world), node_(node), factor_(factor) {}

StragglerReport StragglerDetector::observe(double compute_seconds) {
  const at::Tensor mine = at::tensor({compute_seconds, static_cast<double>(node_)}, at::kDouble);
  at::Tensor all = at::empty({2 * world_.size()}, mine.options());
  world_.all_gather_into_tensor(all, mine);
  const double* v = all.data_ptr<double>();
  StragglerReport r;
  for (int i = 0; i < world_.size(); ++i) {
    r.compute_seconds.push_back(v[2 * i]);
    r.nodes.push_back(static_cast<int>(v[2 * i + 1]));
  }
  std::vector<double> sorted = r.compute_seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  r.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  r.slowest_rank = static_cast<int>(std::max_element(r.compute_seconds.begin(), r.compute_seconds.end()) -
                                    r.compute_seconds.begin());
  r.ratio = r.median > 0 ? r.compute_seconds[static_cast<size_t>(r.slowest_rank)] / r.median : 0;
  r.named = r.ratio > factor_;
  return r;
}

std::string StragglerReport::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "straggler: rank %d (node %d) computed %.3f s in this log window, %.2fx the median %.3f s of %zu "
                "ranks (metrics.straggler_factor)",
                slowest_rank, nodes[static_cast<size_t>(slowest_rank)],
                compute_seconds[static_cast<size_t>(slowest_rank)], ratio, median, compute_seconds.size());
  return buf;
}

}  // namespace titan::trainer::observe
