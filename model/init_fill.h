// model/init_fill.h — fills any box of a parameter with its counter-based initial values
// (See Note [Counter-based init] in model/init_philox.h): on the CPU (at::parallel_for) or, in
// the CUDA build, by the CUDA twin (model/init_kernels.cu), equal bit for bit.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <string>

namespace titan::model {

// One parameter's distribution: ones, or float(std * z) with z standard normal, redrawn while
// outside [lo, hi] (torch.nn.init.trunc_normal_'s absolute bounds; +-infinity: plain normal_).
struct InitSpec {
  bool ones = false;
  double std = 1.0;
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
};

// `out` [lengths...] (1-D or 2-D, any dtype, device and strides) receives the elements of the
// full parameter `fqn` [full_shape] that start at `offsets`: out[i, j] = value of full element
// ((offsets[0] + i) * full_shape[1] + offsets[1] + j). Only these elements are computed. A 3-D
// or deeper parameter (stacked experts) is its 2-D view [all but the last dim, last dim], the box
// holding its middle dims whole (a view of `out` must exist: contiguous within a row block).
// Throws std::invalid_argument naming `fqn` when a non-empty box does not fit in full_shape.
void fill_init_box(const at::Tensor& out, const InitSpec& spec, uint64_t seed,
                   const std::string& fqn, at::IntArrayRef full_shape, at::IntArrayRef offsets);

// Whether the CUDA twin was compiled in (TITAN_CUDA build).
bool init_cuda_available();

}  // namespace titan::model
