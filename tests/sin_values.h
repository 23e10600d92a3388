// tests/sin_values.h — the deterministic tensors the torchtitan fixtures are built on
// (scripts/reference/torchtitan_moe.py, torchtitan_qwen3.py compute the same): element i of a
// tensor of `shape` is offset + scale * sin(1.7 i + seed), in float64, rounded to float32.
#pragma once

#include <ATen/ops/tensor.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace titan::testing {

inline at::Tensor sin_values(const std::vector<int64_t>& shape, int seed, double scale, double offset = 0.0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(offset + scale * std::sin(1.7 * i + seed));
  return at::tensor(v).view(shape).clone();
}

}  // namespace titan::testing
