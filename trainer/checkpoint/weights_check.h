// trainer/checkpoint/weights_check.h — what a loaded weight may hold, and loading a weights file by name.
//
// Note [Weights that cannot train]: a loaded weight is refused when it holds NaN, +-Inf, or a
// finite value with |x| >= 2^64 (about 1.8e19, e.g. 1e30): the square of such a value overflows
// float32 (FLT_MAX is just under 2^128), so the first step's gradient-norm sum of squares (and
// RMSNorm's mean of squares, AdamW's second moment) is Inf, and the run is non-finite from its
// first step. bfloat16 shares float32's exponent range, and the float8 recipes scale by amax
// before casting, so no smaller bound follows from the casts; values far below 2^64 (1e4, say)
// are odd but train, and are left to the user.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "model/args.h"

namespace titan::trainer::checkpoint {

struct WeightValueCounts {
  int64_t nan = 0, inf = 0, huge = 0;  // huge: finite with |x| >= 2^64
  bool ok() const { return nan == 0 && inf == 0 && huge == 0; }
  std::string describe() const;  // "3 NaN, 1 Inf, 2 finite values with |x| >= 2^64 (~1.8e19)"
};
// Counts NaN, Inf and (when `check_magnitude`) huge values of a floating tensor; integer
// tensors count nothing.
WeightValueCounts count_bad_weight_values(const at::Tensor& t, bool check_magnitude = true);
// Throws std::runtime_error "<what> holds <counts>: ..." when the counts are not all zero.
void check_weight_values(const at::Tensor& t, const std::string& what, bool check_magnitude = true);

// Loads a weights file for checkpoint.initial_load_path: a safetensors file of titan fqns or a
// Hugging Face checkpoint (folder or index). Names are checked before any tensor is read: ONE
// error lists every name the model lacks and every parameter the file lacks. Then each tensor
// is read, checked (check_weight_values) and handed to `load(fqn, full tensor)`. The model's
// persistent `buffers` (MoE layers' expert_bias) may be absent: a file of titan names holds
// them by their fqn, an HF checkpoint where its family's format has a tensor for them
// (hf_buffer_name); each one present is loaded like a parameter. Returns the buffers the file
// does not hold, for the caller to say so.
std::vector<std::string> load_weights_file(const std::string& path, const model::ModelArgs& args,
                                           const std::vector<std::string>& fqns,
                                           const std::function<void(const std::string&, const at::Tensor&)>& load,
                                           const std::vector<std::string>& buffers = {});

}  // namespace titan::trainer::checkpoint
