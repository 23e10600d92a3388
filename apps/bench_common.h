// apps/bench_common.h — timing helpers shared by the benchmark executables.
#pragma once

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace titan::bench {

// A dimension divided by `scale` (CPU runs shrink Llama shapes), kept a multiple of 16 so the
// float8 GEMM constraints still hold.
inline int64_t scaled(int64_t v, int64_t scale) {
  return std::max<int64_t>(16, (v / scale + 15) / 16 * 16);
}

// Milliseconds of one call of fn (synchronizing CUDA around it): for benchmarks that alternate
// two steps call by call and report medians.
inline double call_ms(const std::function<void()>& fn, bool cuda) {
  if (cuda) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Mean milliseconds of fn over iters after one warm-up call (synchronizing CUDA around it).
inline double time_ms(const std::function<void()>& fn, int iters, bool cuda) {
  fn();
  if (cuda) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         iters;
}

}  // namespace titan::bench
